"""Slurm partitions: demand from the real scheduler, nodes that join it, drains and
requeues before a reclaim's deadline, through Slurm's own tools (`squeue --json`,
`sinfo --json`, `scontrol`). See `sco.adapters.slurm.nodes` for the integration model
(dynamic nodes, with FUTURE placeholder nodes that declare the class features)."""
