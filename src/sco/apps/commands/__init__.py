"""The control plane's commands, all reading `sco.yaml`, grouped by who runs them:
the containers (`serve`), the operator (`operate`), the node (`node`) and the
cloud operator (`reclaim`).

    sco run              controllers, a leader per partition
    sco watch            exclusion watcher (continuous consumer of the event log)
    sco score            pool scorer (one pass, or --every 5m)
    sco history load     event log into pool history (continuous)
    sco explain P        the current plan of a partition, pool by pool, with reasons
    sco handback P       hand a partition back: drain and delete all it holds
    sco config check F   validate a configuration and print it resolved, secrets masked
    sco config reference every key of sco.yaml, generated from the settings model
    sco slurm conf P     the slurm.conf lines a Slurm partition's dynamic nodes need
    sco slurm job-submit the job_submit.lua that keeps each job of many nodes in one pool
    sco slurm usage P    node-hours of a Slurm partition's jobs by capacity class
    sco distributor      node contracts over HTTP, for the nodes' agents
    sco status           the status page: partitions, pools, plans, recent events
    sco agent            on a node: follow its contract, leave before drain_by
    sco reclaim          the cloud operator's side: take spot servers back with notice
    sco tokens rotate P  revoke a partition's node tokens; new ones follow

`--config` (or `SCO_CONFIG`) names the file; every field can be overridden by a
`SCO_...` environment variable, and each command's flags override both. Each module
is imported only when one of its commands runs (`sco.apps.cli.COMMANDS`): nothing
here imports them.
"""
