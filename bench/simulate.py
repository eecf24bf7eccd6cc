"""How fast the controller runs in simulated time.

Runs the demo's region and demand (bundled 9-zone V100 trace, two partitions)
for a number of simulated days and prints one JSON object as its last line:
simulated days per wall second and controller cycles per second.

With `--instances N` it runs the first fleet scenario instead
(`sco.lab.fleet`: the 9-zone V100 trace with each 1 standing for 1,000
instances, N instances of demand at the peak over four partitions, ample
guaranteed quota) in the fleet suite's setting (`sco.lab.fleet_eval`: a
900 s warm-up that counts nothing, event-driven cycles), and adds the fleet
measures.

    .venv/bin/python bench/simulate.py [--days 7] [--cycle-s 30] [--instances 5000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from sco.adapters.sqlstate.store import sqlite_url
from sco.apps.common import bundled
from sco.lab.fleet import FLEET
from sco.lab.fleet_eval import FleetCase
from sco.lab.region import SimConfig
from sco.lab.simulation import Simulation, SimulationSpec
from sco_harness.services import stop_on_signals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--cycle-s", type=float, default=30.0)
    ap.add_argument("--instances", type=int, default=None, help="Run the fleet scenario.")
    ap.add_argument("--notice-s", type=float, default=0.0)
    ap.add_argument("--policy", default="sco", help="With --instances: the policy to run.")
    ap.add_argument(
        "--idle-resync-s", type=float, default=None,
        help="Event-driven cycles: a partition cycles on what changed, and at least this "
        "often (with --instances: the fleet suite's 300 s unless given).",
    )  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(args, Path(tmp))
        t0 = time.perf_counter()
        sim = Simulation.build(spec)
        load_s = time.perf_counter() - t0
        result = sim.run(sqlite_url(Path(tmp) / "state.db"))
    partition_cycles = result.cycles * len(result.partitions)
    out: dict[str, object] = {
        "simulated_days": (result.end_s - result.start_s) / 86400,
        "load_s": round(load_s, 3),
        "run_s": round(result.wall_s, 3),
        "sim_days_per_s": round((result.end_s - result.start_s) / 86400 / result.wall_s, 3),
        "controller_cycles_per_s": round(partition_cycles / result.wall_s, 1),
        "transitions": result.counts.history_rows,
        "transitions_per_s": round(result.counts.history_rows / result.wall_s),
    }
    if args.instances:
        agg = result.aggregate()
        out |= {"instances": args.instances} | {
            k: round(float(agg[k]), 4)
            for k in ("served_fraction", "floor_availability", "availability",
                      "cost_vs_guaranteed", "guaranteed_share", "below_floor_unit_h")
        }  # fmt: skip
    print(json.dumps(out))


def _spec(args: argparse.Namespace, tmp: Path) -> SimulationSpec:
    if not args.instances:
        return SimulationSpec(
            traces=bundled("traces", "apache", "v100-9zone"),
            demand=bundled("demand", "demo.yaml"),
            duration_s=args.days * 86400,
            cycle_s=args.cycle_s,
            sim=SimConfig(notice_s=args.notice_s),
            idle_resync_s=args.idle_resync_s,
        )
    # The fleet suite's first scenario and its setting (warm-up, event-driven cycles).
    fleet = FLEET["v100-9zone-x1000"]
    case = FleetCase(
        fleet.name,
        bundled("traces", *fleet.trace),
        fleet.write_demand(tmp, args.instances),
        fleet.sim_config(),
    )
    spec = case.spec(args.policy, 0.0, args.days * 86400, args.notice_s)
    resync = args.idle_resync_s if args.idle_resync_s is not None else spec.idle_resync_s
    return dataclasses.replace(spec, cycle_s=args.cycle_s, idle_resync_s=resync)


if __name__ == "__main__":
    with stop_on_signals():
        main()
