"""One package per real system (OpenStack, OpenBao, the SQL fleet state, Kafka,
ClickHouse, Kubernetes, Slurm, demand files), each implementing ports of
`sco.ports`; third-party clients are imported only here. The lab's twins and
simulated region live in `sco.lab`."""
