"""Whole controller cycles at fleet size: one partition of 20,000 instances over 200
pools, fleet state on PostgreSQL.

A simulated region (200 spot pools of 150 instances in 10 halls, guaranteed quota in
each hall) stands in for the cloud, so that the cycle measured is the controller's
own work: observe (list the servers, read the nodes), sync the records, decide
(plan and floor keeper), act (reserve and create, drain, delete), written to
PostgreSQL. The partition is first brought to its target; then the clock moves
15 s a cycle, while a pool now and then loses capacity (reclaims to replace).

Prints one JSON line: {"instances", "pools", "cycles", "cycle_p50_s",
"cycle_p99_s", "cycle_max_s", "fill_cycles", "phase_us_per_instance" (each phase
of the cycle, its mean cost in microseconds per instance), ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import ScoPolicy
from sco.engine import builder
from sco.engine.builder import FleetState, Ports
from sco.engine.clock import CountingIds, ManualClock
from sco.engine.gcpolicy import tune_gc
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.postgres import PostgresServer
from sco_harness.services import stop_on_signals


def log(msg: str) -> None:
    print(f"[bench/cycle] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    tune_gc()  # as every `sco` process does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=20_000)
    ap.add_argument("--pools", type=int, default=200)
    ap.add_argument("--cycles", type=int, default=120, help="Cycles measured at target.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-bench-cycle-") as tmp:
        pg = PostgresServer().start()
        try:
            print(json.dumps(run(Path(tmp), pg.new_database(), args), sort_keys=True))
        finally:
            pg.stop()


def _region(folder: Path, pools: int, per_pool: int, ticks: int) -> Path:
    traces = folder / "traces"
    for k in range(pools):
        # Every 10th pool drops to two thirds for one 10-minute tick, at its own time.
        values = [per_pool] * ticks
        if k % 10 == 0:
            values[(k // 10) % (ticks - 1) + 1] = per_pool * 2 // 3
        write_json_trace(traces, f"z{k:03d}", values, gap_s=600)
    spec = {"halls": 10, "guaranteed_quota_per_hall": 2_000, "spot_price_per_h": 1.0,
            "guaranteed_price_per_h": 3.0}  # fmt: skip
    write_yaml(traces / "region.yaml", spec)
    return traces


def run(folder: Path, url: str, args: argparse.Namespace) -> dict[str, object]:
    per_pool = int(args.instances * 1.5 / args.pools)
    traces = _region(folder, args.pools, per_pool, ticks=48)
    demand = write_yaml(folder / "demand.yaml", {"partitions": [{
        "name": "fleet", "kind": "kubernetes", "target_units": args.instances,
        "floor_units": args.instances * 3 // 4, "max_units": args.instances * 6 // 5,
        "guaranteed_budget_units": args.instances // 5,
    }]})  # fmt: skip
    region = SimRegion(load_traces(traces), SimConfig(api_latency_s=1.0, cold_start_s=60.0))
    clock = ManualClock(0.0)
    store = SqlFleetStore(url)
    store.upsert_pools(region.pools())
    source = FileDemandSource.load(demand, "traces", 0.0)
    ports = Ports(region, region, source, FleetState.of(store), clock, CountingIds())
    (controller,) = builder.controllers(ports, ScoPolicy)
    t = 0.0
    fill = 0
    started = time.perf_counter()
    while True:
        region.advance_to(t)
        clock.set(t)
        report = controller.cycle()
        fill += 1
        t += 15.0
        ready = report.placement.placed if report.placement else 0
        if ready >= args.instances or fill > 400:
            break
    log(f"{ready} units ready after {fill} cycles ({time.perf_counter() - started:.0f} s)")
    took: list[float] = []
    phases: dict[str, list[float]] = {}
    for _ in range(args.cycles):
        region.advance_to(t)
        clock.set(t)
        c0 = time.perf_counter()
        report = controller.cycle()
        took.append(time.perf_counter() - c0)
        for phase, s in report.phases_s.items():
            phases.setdefault(phase, []).append(s)
        t += 15.0
    store.close()
    took.sort()
    return {
        # Each phase's mean cost per cycle, in microseconds per instance held.
        "phase_us_per_instance": {
            phase: round(statistics.fmean(s) / args.instances * 1e6, 2)
            for phase, s in sorted(phases.items())
        },
        "instances": args.instances,
        "pools": args.pools,
        "cycles": len(took),
        "fill_cycles": fill,
        "cycle_p50_s": round(statistics.median(took), 3),
        "cycle_p99_s": round(took[min(len(took) - 1, int(0.99 * len(took)))], 3),
        "cycle_max_s": round(took[-1], 3),
    }


if __name__ == "__main__":
    with stop_on_signals():
        main()
