"""In-memory twins of the state ports: fleet state and the event log held in
process, for the lab's runs at fleet size. Each is held to the same semantics as
its SQL adapter by one conformance suite (tests/test_state_conformance.py)."""
