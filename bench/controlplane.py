"""The whole control plane as separate OS processes, and a pool reclaimed at once.

Starts PostgreSQL, a Kafka-protocol broker (tansu) and the Nova test stack (three
halls of two fake computes, four spot slots each), then, from one sco.yaml, five
processes: two `sco run` replicas, `sco watch`, `sco score --every 60s` and
`sco history load` (chDB). Six partitions fill on spot; after a steady minute every
spot server of one pool is reclaimed at once (deleted, as a reclaimer without
notice would). The watcher excludes the pool; both replicas must act on it (their
/metrics show it excluded) and refill elsewhere. After another steady minute the
processes are stopped with SIGTERM and the run is audited.

Prints one JSON line:
{"processes", "exclusion_visible_s", "score_generations", "events_committed",
 "events_in_topic", "events_in_history", "lost_events", "duplicate_creates",
 "leaked_servers", "cycle_p99_s", ...}
- exclusion_visible_s: from the watcher's crossing (the exclusion's `since`) to the
  later of the two replicas planning with the pool excluded (target: <= 5 s);
- events_committed: transitions and exclusions written to fleet state, each an
  event in the outbox; events_in_topic / events_in_history: how many of those ids
  reached the Kafka topic and pool history; lost_events: committed ids missing
  from either (target: 0);
- duplicate_creates, leaked_servers: servers beyond their request's records, and
  servers with no live record (targets: 0);
- cycle_p99_s: the 99th percentile of every partition cycle of both replicas
  (`sco_cycle_seconds`, target <= 2 s).
- phase_p99_s: the same per phase of the cycle (`sco_cycle_phase_seconds`: observe_cloud,
  observe_scheduler, sync, signals, plan, act, publish), to tell where a slow cycle's
  time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sco.engine.cycle import PHASES
from sco_harness.chaos import audit
from sco_harness.controlplane import (
    REPLICAS,
    ControlPlaneRun,
    acting_on,
    exclusion_since,
    histogram_quantile,
    ready_servers,
    sample,
    spot_servers,
    start_control_plane,
    stop_and_audit,
    wait_for,
)
from sco_harness.kafka_broker import TansuBroker
from sco_harness.openstack_stack import NovaStack
from sco_harness.postgres import PostgresServer
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}
PARTITIONS = 6
TARGET = 2
VICTIM = "lab/hall-a/spot.small"


def log(msg: str) -> None:
    print(f"[bench/controlplane] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady-s", type=float, default=60.0, help="steady time before/after")
    parser.add_argument("--base-port", type=int, default=18900)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-bench-cp-") as tmp:
        folder = Path(tmp)
        result = run(folder, args.steady_s, args.base_port)
    print(json.dumps(result, sort_keys=True))


def run(folder: Path, steady_s: float, base_port: int) -> dict[str, Any]:
    started = time.monotonic()
    postgres = PostgresServer().start()
    broker = TansuBroker(folder / "tansu").start()
    stack = NovaStack(folder / "nova", base_port, HALLS, 4)
    try:
        stack.up()
        log(f"PostgreSQL, tansu and Nova up in {time.monotonic() - started:.0f} s")
        region_file = folder / "region.yaml"
        import yaml

        region_file.write_text(yaml.safe_dump(stack.region()))
        return measure(folder, stack, postgres.new_database(), broker, region_file, steady_s)
    finally:
        stack.down()
        broker.stop()
        postgres.stop()


def measure(
    folder: Path,
    stack: NovaStack,
    url: str,
    broker: TansuBroker,
    region_file: Path,
    steady_s: float,
    partitions: int = PARTITIONS,
    min_candidates: int = 2,
) -> dict[str, Any]:
    """The measure on running services (the test suite's smoke run brings its own,
    with fewer partitions on its two-hall stack, where excluding one of its two spot
    pools needs `min_candidates` 1)."""
    prefix = f"sco.bench{uuid.uuid4().hex[:6]}."
    history_url = f"chdb://{folder / 'history'}"
    config = {
        "state": {"url": url},
        "events": {
            "kind": "kafka",
            "kafka": {"brokers": broker.bootstrap, "topic_prefix": prefix},
        },
        "history": {"url": history_url},
        "leases": {"kind": "database", "ttl_s": 15},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region_file),
            "clouds_file": str(stack.clouds_yaml),
        },
        "partitions": [
            {
                "name": f"p{i}",
                "kind": "slurm",
                "target_units": TARGET,
                "floor_units": 1,
                "max_units": TARGET,
            }
            for i in range(partitions)
        ],
        "policy": {"interval_s": 5, "exclusion": {"min_candidates": min_candidates}},
        "log": {"level": "info"},
    }
    run = ControlPlaneRun(folder / "cp", config, dict(os.environ))
    try:
        start_control_plane(run, score_every="60s")
        want = partitions * TARGET

        def spot() -> list[dict[str, Any]]:
            return spot_servers(stack.servers(tags="sco"))

        def known() -> list[dict[str, Any]]:
            ready = ready_servers(url)
            return [s for s in spot() if s["id"] in ready]

        wait_for(lambda: len(known()) >= want, 300, f"{want} spot servers ready", every_s=1.0)
        log(f"{want} spot servers; steady for {steady_s:.0f} s")
        time.sleep(steady_s)
        victims = [s["id"] for s in known() if s["OS-EXT-AZ:availability_zone"] == "hall-a"]
        reclaimed_at = time.time()
        for sid in victims:
            r = stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
            if r.status_code not in (204, 404):
                raise RuntimeError(f"delete {sid}: HTTP {r.status_code}")
        log(f"reclaimed every spot server of {VICTIM}: {len(victims)}")
        since = exclusion_since(url, VICTIM, 120)
        visible_s = max(acting_on(run, VICTIM, 120).values()) - since
        log(
            f"excluded {since - reclaimed_at:.1f} s after the reclaim; both replicas acting "
            f"{visible_s:.2f} s after the crossing"
        )
        wait_for(lambda: len(spot()) >= want, 300, "the reclaimed servers replaced", every_s=1.0)
        replaced_s = time.time() - reclaimed_at
        time.sleep(steady_s)
        texts = [run.metrics(name) for name in REPLICAS]
        cycle_p99 = histogram_quantile(texts, "sco_cycle_seconds", 0.99)
        phase_p99 = {
            phase: histogram_quantile(texts, "sco_cycle_phase_seconds", 0.99, phase=phase)
            for phase in PHASES
        }
        cycles = sum(
            sample(t, "sco_cycle_seconds_count", partition=f"p{i}") or 0
            for t in texts
            for i in range(partitions)
        )
        generations = sample(run.metrics("score"), "sco_score_generation") or 0
        events = stop_and_audit(run, url, history_url, broker.bootstrap, prefix)
        found = audit(url, stack.servers(tags="sco"))
    finally:
        run.stop_all()
    return {
        "processes": len(run.procs),
        "exclusion_visible_s": round(visible_s, 3),
        "excluded_after_reclaim_s": round(since - reclaimed_at, 3),
        "replaced_s": round(replaced_s, 1),
        "score_generations": int(generations),
        **{k: v for k, v in events.items() if k != "lost_ids"},
        "duplicate_creates": found["duplicate_creates"],
        "leaked_servers": found["leaked_servers"],
        "lost_transitions": found["lost_transitions"],
        "cycles": int(cycles),
        "cycle_p99_s": round(cycle_p99 or 0.0, 3),
        "phase_p99_s": {k: round(v or 0.0, 3) for k, v in phase_p99.items()},
    }


if __name__ == "__main__":
    with stop_on_signals():
        main()
