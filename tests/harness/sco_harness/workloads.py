"""A synthetic batch workload in SWF, for trying `sco replay` and for tests: Poisson
arrivals, 1 to 16 nodes (log-uniform), log-normal run times (median ~30 min) and time
limits 1.1 to 3 times the run, as users overestimate them. The bundled
`src/sco/data/workloads/synthetic-2d.swf` is `synthetic(300, 2.0, 32)`. Test support,
not product: the bundled file is what users get."""

from __future__ import annotations

import random

PROCS_PER_NODE = 4


def synthetic(jobs: int, days: float, max_nodes: int, seed: int = 0) -> str:
    r = random.Random(seed)
    lines = [
        f"; sco synthetic workload: {jobs} jobs over {days:g} days, seed {seed}",
        f"; MaxNodes: {max_nodes}",
        f"; MaxProcs: {max_nodes * PROCS_PER_NODE}",
    ]
    t = 0.0
    for i in range(1, jobs + 1):
        t += r.expovariate(jobs / (days * 86400))
        procs = min(max_nodes, int(2 ** r.uniform(0, 4))) * PROCS_PER_NODE
        run = int(r.lognormvariate(7.5, 1.0)) + 1
        limit = int(run * r.uniform(1.1, 3))
        fields = [i, int(t), -1, run, procs, -1, -1, procs, limit, -1, 1, 1, 1, 1, 1, 1, -1, -1]
        lines.append(" ".join(map(str, fields)))
    return "\n".join(lines) + "\n"
