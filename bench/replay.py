"""A batch workload replayed at fleet size (issue 27): how long `sco replay` takes.

Generates a synthetic workload (`sco_harness.workloads`: Poisson arrivals, 1-16
nodes, log-normal run times) and replays it on the bundled 9-zone V100 trace under
the policies asked for. Prints one JSON line:
{"jobs", "days", "max_nodes", "pool_size", "wall_s", "sim_days_per_wall_min",
 "month_estimate_min", "policies": {name: {outcomes...}}}
- month_estimate_min: 30 days at this rate, per policy (the bar: <= 10).

    .venv/bin/python bench/replay.py [--jobs 8000 --days 1 --max-nodes 2048 --pool-size 256]
    .venv/bin/python bench/replay.py --smoke     # seconds: CI keeps it from rotting
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sco.apps.common import bundled
from sco.engine.gcpolicy import tune_gc
from sco.lab.workload.replay import ReplaySpec, replay
from sco_harness.workloads import synthetic


def main() -> None:
    tune_gc()  # as every `sco` process does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8000)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--max-nodes", type=int, default=2048)
    ap.add_argument("--pool-size", type=int, default=256)
    ap.add_argument("--policies", default="sco")
    ap.add_argument("--smoke", action="store_true", help="200 jobs, 0.1 days, 64 nodes")
    args = ap.parse_args()
    if args.smoke:
        args.jobs, args.days, args.max_nodes, args.pool_size = 200, 0.1, 64, 16
    with tempfile.TemporaryDirectory(prefix="sco-bench-replay-") as tmp:
        path = Path(tmp) / "workload.swf"
        path.write_text(synthetic(args.jobs, args.days, args.max_nodes))
        spec = ReplaySpec(
            path,
            bundled("traces", "apache", "v100-9zone"),
            days=args.days,
            pool_size=args.pool_size,
        )
        started = time.perf_counter()
        _, runs, _ = replay(spec, args.policies.split(","))
        wall = time.perf_counter() - started
    per_policy = wall / len(runs)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "days": args.days,
                "max_nodes": args.max_nodes,
                "pool_size": args.pool_size,
                "wall_s": round(wall, 2),
                "sim_days_per_wall_min": round(args.days / (per_policy / 60), 3),
                "month_estimate_min": round(30 / args.days * per_policy / 60, 1),
                "policies": {r.policy: r.outcomes for r in runs},
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
