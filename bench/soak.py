"""Soak: the control plane for half an hour under replica kills, reclaims and a failover.

Starts a two-node Patroni cluster (synchronous replication), a Kafka-protocol
broker (tansu) and the Nova test stack (three halls of two fake computes, four
spot slots each), then, from one sco.yaml, three `sco run` replicas, `sco
watch` and `sco history load --score-every 60s` (chDB, which one process holds).
Six partitions of target 2 (floor 1) cycle every 2 s (policy.interval_s); leases
live 15 s (leases.ttl_s). Once the fleet is at target, for `--minutes`:

- every `--kill-every-s` a replica is killed with SIGKILL, and a new one (a new
  name: a restarted process is a new replica) starts `--restart-after-s` later,
  as an orchestrator restarts a crashed one. The first replica is never killed, so
  one replica's memory is measured over the whole run;
- every `--reclaim-every-s` one random ACTIVE spot server sco created is deleted
  (a reclaim without notice); it must be replaced;
- once, at `--failover-at-s` (minute 17 of 30), the Patroni primary is killed with
  SIGKILL (Patroni and its PostgreSQL), as `sco_harness.failover` does.

Then three rolling-upgrade stops: a replica gets SIGTERM (it hands its leases
back), a new one starts, and the replicas rebalance.

Measures:
- leaderless_s, per kill and per partition the killed replica held (leases
  table, at the kill): every replica's /metrics is scraped every 0.5 s for when
  each partition's last cycle ended (`sco_partition_last_cycle_timestamp_seconds`)
  and by which replica; leaderless_s = (the end of the first cycle another
  replica completed after the kill) - (the kill). It is the lease running out
  (at most the TTL after the kill), the takeover and the new leader's first
  cycle. Target: <= lease TTL + 1 s. Also cycle_gap_s: from the partition's last
  cycle before the kill instead, which adds the part of a cycle interval that
  had passed at the kill.
- availability_month: with one crash per replica per day for 30 days, the
  expected seconds a partition has no leader in a month are
  R x 30 x L x f, where R is the replicas (3), L the mean leaderless_s per
  affected partition per crash and f the share of the partitions a crash
  affects (mean held by the victim / partitions); availability = 1 - that /
  (30 x 86400). Target >= 99.9 %.
- memory_growth: every process's RSS every 10 s; growth = RSS at its last
  sample / RSS at its first sample after `--warmup-s` (300) of its life, - 1.
  Processes that lived `--warmup-s` + 300 s or more are reported (restarted
  replicas from their own start); `memory_growth_max` is over the processes
  that lived through the whole run (the first replica, watch, history).
  Target <= 5 %.
- handover_s: per SIGTERM, for each partition the stopped replica held, from
  the SIGTERM to another replica holding it (leases table, polled every 50 ms).
  Target <= 2 s. Its leaderless_s as above, and the replica's exit status.
- failover_s (the kill to a new primary) and failover_leaderless_s (per
  partition, as leaderless_s, around the primary's kill: no lease can be proven
  while the database is away, so every partition stops by design).
- reclaims, replaced (back at target after each), replaced_max_s.
- duplicate_creates, leaked_servers, lost_transitions (sco_harness.chaos.audit)
  and lost_events (committed events missing from the topic or pool history:
  sco_harness.controlplane.stop_and_audit).

Progress lines on stderr every minute; one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from sco_harness.chaos import audit
from sco_harness.controlplane import ControlPlaneRun, start_control_plane, stop_and_audit, wait_for
from sco_harness.kafka_broker import TansuBroker
from sco_harness.openstack_stack import NovaStack
from sco_harness.patroni import PatroniCluster
from sco_harness.services import stop_on_signals

# Its parts are in bench/soaklib. Run as a script, this file's folder is first on
# the path; loaded by path (the tests' `bench` fixture), it is not there at all. It
# goes last, so that no program in bench/ hides a module of the same name.
sys.path.append(str(Path(__file__).resolve().parent))

from soaklib.run import FIRST, INTERVAL_S, LEASE_TTL_S, PARTITIONS, TARGET, Soak
from soaklib.watch import log

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}


# ---------------------------------------------------------------- setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--kill-every-s", type=float, default=300.0)
    ap.add_argument("--reclaim-every-s", type=float, default=60.0)
    ap.add_argument("--restart-after-s", type=float, default=5.0)
    ap.add_argument("--failover-at-s", type=float, default=None, help="Default: minute 17 of 30.")
    ap.add_argument("--warmup-s", type=float, default=300.0, help="Memory: each process's warm-up.")
    ap.add_argument("--measure-s", type=float, default=300.0, help="Memory: at least this long.")
    ap.add_argument("--rolling-stops", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=19560)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-soak-") as tmp:
        folder = args.workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        result = run(folder, args)
    print(json.dumps(result, sort_keys=True))


def run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    cluster = PatroniCluster().start()
    broker = TansuBroker(folder / "tansu").start()
    stack = NovaStack(folder / "nova", args.base_port, HALLS, 4)
    try:
        stack.up()
        log("Patroni, tansu and Nova up")
        region_file = folder / "region.yaml"
        region_file.write_text(yaml.safe_dump(stack.region()))
        return measure(folder, stack, cluster, broker, region_file, args)
    finally:
        stack.down()
        broker.stop()
        cluster.stop()


def measure(
    folder: Path,
    stack: NovaStack,
    cluster: PatroniCluster,
    broker: TansuBroker,
    region_file: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    url = cluster.url()
    prefix = f"sco.soak{uuid.uuid4().hex[:6]}."
    history_url = f"chdb://{folder / 'history'}"
    config = {
        "state": {"url": url},
        "events": {"kind": "kafka", "kafka": {"brokers": broker.bootstrap, "topic_prefix": prefix}},
        "history": {"url": history_url},
        "leases": {"kind": "database", "ttl_s": LEASE_TTL_S},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region_file),
            "clouds_file": str(stack.clouds_yaml),
        },
        "partitions": [
            {"name": f"p{i}", "kind": "slurm", "target_units": TARGET, "floor_units": 1,
             "max_units": TARGET}
            for i in range(PARTITIONS)
        ],
        "policy": {"interval_s": INTERVAL_S},
        "log": {"level": "info"},
    }  # fmt: skip
    run = ControlPlaneRun(folder / "cp", config, dict(os.environ))
    soak: Soak | None = None
    try:
        # chDB history: the scorer in the loader, as the README says to run them.
        start_control_plane(run, score_every="60s", replicas=FIRST, scorer_in_loader=True)
        soak = Soak(run, stack, cluster, url, args)
        wait_for(soak.at_target, 600, f"{soak.want} spot servers ready", every_s=1.0)
        log(f"{soak.want} spot servers ready; soaking for {args.minutes:g} min")
        soak.soak()
        log("soak over; rolling stops")
        soak.rolling_stops(args.rolling_stops)
        wait_for(soak.at_target, 300, "the fleet at target", every_s=1.0)
        soak.cycles.stop()
        result = soak.result()
        events = stop_and_audit(
            run, url, history_url, broker.bootstrap, prefix, replicas=list(soak.ever)
        )
        found = audit(url, stack.servers(tags="sco"))
    finally:
        if soak is not None:
            soak.cycles.stop()
            soak.memory.stop()
            soak.leases.close()
        run.stop_all()
    result.update({k: v for k, v in events.items() if k not in ("lost_ids", "exit_codes")})
    result.update(
        duplicate_creates=found["duplicate_creates"],
        leaked_servers=found["leaked_servers"],
        lost_transitions=found["lost_transitions"],
    )
    return result


if __name__ == "__main__":
    with stop_on_signals():
        main()
