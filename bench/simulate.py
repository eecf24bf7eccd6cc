"""How fast the controller runs in simulated time.

Runs the demo's region and demand (bundled 9-zone V100 trace, two partitions)
for a number of simulated days and prints one JSON object as its last line:
simulated days per wall second and controller cycles per second.

Fleet state and the event log are the lab's in-memory twins unless `--state
sqlite` asks for a database. `same_as_sql` says whether a short window of the
same run (`--check-days`) gives the same results on both.

With `--instances N` it runs the first fleet scenario instead
(`sco.lab.fleet`: the 9-zone V100 trace with each 1 standing for 1,000
instances, N instances of demand at the peak over four partitions, ample
guaranteed quota) in the fleet suite's setting (`sco.lab.fleet_eval`: a
900 s warm-up that counts nothing, event-driven cycles), and adds the fleet
measures.

    .venv/bin/python bench/simulate.py [--days 7] [--cycle-s 30] [--instances 5000]
        [--state memory|sqlite] [--check-days 0.25]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from sco.adapters.sqlstate.engine import sqlite_url
from sco.apps.common import bundled
from sco.engine.gcpolicy import tune_gc
from sco.lab.fleet import FLEET
from sco.lab.fleet_eval import FleetCase
from sco.lab.region import SimConfig
from sco.lab.simulation import Simulation, SimulationSpec
from sco_harness.services import stop_on_signals


def main() -> None:
    tune_gc()  # as every `sco` process does
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
    ap.add_argument("--state", choices=["memory", "sqlite"], default="memory")
    ap.add_argument(
        "--check-days", type=float, default=0.25,
        help="The window run both on the twins and on SQLite for same_as_sql (0: none).",
    )  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(args, Path(tmp))
        t0 = time.perf_counter()
        sim = Simulation.build(spec)
        load_s = time.perf_counter() - t0
        url = sqlite_url(Path(tmp) / "state.db") if args.state == "sqlite" else None
        result = sim.run(url)
        same = _same_as_sql(args, Path(tmp)) if args.check_days > 0 else None
    partition_cycles = result.cycles * len(result.partitions)
    out: dict[str, object] = {
        "simulated_days": (result.end_s - result.start_s) / 86400,
        "load_s": round(load_s, 3),
        "run_s": round(result.wall_s, 3),
        "sim_days_per_s": round((result.end_s - result.start_s) / 86400 / result.wall_s, 3),
        "controller_cycles_per_s": round(partition_cycles / result.wall_s, 1),
        "transitions": result.counts.history_rows,
        "transitions_per_s": round(result.counts.history_rows / result.wall_s),
        "state": args.state,
        "same_as_sql": same,
    }
    if args.instances:
        agg = result.aggregate()
        out |= {"instances": args.instances} | {
            k: round(float(agg[k]), 4)
            for k in ("served_fraction", "floor_availability", "availability",
                      "cost_vs_guaranteed", "guaranteed_share", "below_floor_unit_h")
        }  # fmt: skip
    print(json.dumps(out))


def _same_as_sql(args: argparse.Namespace, tmp: Path) -> bool:
    """The first `--check-days` of the run, on the twins and on SQLite: the same
    outcomes, counts, cycles and signals."""
    short = argparse.Namespace(**{**vars(args), "days": min(args.days, args.check_days)})
    spec = _spec(short, tmp)
    on_sql = Simulation.build(spec).run(sqlite_url(tmp / "check.db"))
    in_memory = Simulation.build(spec).run()
    return in_memory.outcome() == on_sql.outcome()


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
