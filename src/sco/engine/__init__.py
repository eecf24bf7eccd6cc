"""The live wing: the controller and the one builder that makes every runner from a
bundle of ports (`builder`), replicas and leases, loops, the signal pump and jobs,
the watcher, metrics. It knows adapters only through `sco.ports`, and never imports
the lab."""
