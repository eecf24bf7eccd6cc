"""In-memory twins of the ports, for the lab's runs at fleet size and the swarm: fleet
state with its lease table and fencing (`fleet`, `leases`), Kubernetes-kind leases
(`leases`) and the event log (`eventlog`). Each is held to the same semantics as
its real adapters by one conformance suite per port (`tests/conformance/`)."""
