"""How fast the controller runs in simulated time.

Runs the demo's region and demand (bundled 9-zone V100 trace, two partitions)
for a number of simulated days and prints one JSON object as its last line:
simulated days per wall second and controller cycles per second.

    .venv/bin/python bench/simulate.py [--days 7] [--cycle-s 30]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sco.adapters.sqlstate.store import sqlite_url
from sco.apps.cli import bundled
from sco.runtime.simulation import Simulation, SimulationSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--cycle-s", type=float, default=30.0)
    args = ap.parse_args()
    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-9zone"),
        demand=bundled("demand", "demo.yaml"),
        duration_s=args.days * 86400,
        cycle_s=args.cycle_s,
    )
    t0 = time.perf_counter()
    sim = Simulation.build(spec)
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        result = sim.run(sqlite_url(Path(tmp) / "state.db"))
    partition_cycles = result.cycles * len(result.partitions)
    print(
        json.dumps(
            {
                "simulated_days": (result.end_s - result.start_s) / 86400,
                "load_s": round(load_s, 3),
                "run_s": round(result.wall_s, 3),
                "sim_days_per_s": round((result.end_s - result.start_s) / 86400 / result.wall_s, 3),
                "controller_cycles_per_s": round(partition_cycles / result.wall_s, 1),
                "transitions": result.counts.history_rows,
            }
        )
    )


if __name__ == "__main__":
    main()
