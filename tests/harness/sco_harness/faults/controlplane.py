"""The control plane's dependencies failing one at a time, under load.

One run of the whole control plane as processes (two `sco run` replicas, `sco
watch`, `sco history load` on chDB, `sco score --every`) on a two-node Patroni
cluster, a Kafka-protocol broker and the Nova test stack, with six partitions of
two spot servers. sco reaches Nova, Placement and both database nodes through
fault proxies. A churn thread reclaims one spot server every 20 s, so creates
and deletes are in flight whenever a fault strikes.

Faults, in order: Nova's API answering 503 (a 5xx storm); Nova answering in 10 s;
Placement refusing connections; the Kafka broker down for 60 s; the history
store's loader (chDB runs inside it) killed; one replica's clock 2 s ahead while
the other is killed; the database unreachable for 30 s; the Patroni primary lost.

Per fault:
- recovery_s: from the fault's end (the service back; for the failover, the kill
  itself, so promotion counts) to every partition having completed a cycle that
  was not degraded and the fleet being at target again (every partition's spot
  servers created and READY);
- lost_transitions, duplicate_creates, leaked_servers: sco_harness.chaos.audit
  of the fleet state and the Nova listing, the change since the fault before;
- lost_events: committed events (one per transition and exclusion) that did not
  reach pool history (outbox -> topic -> history) within 90 s of recovery;
- stalled_partitions: partitions with no completed cycle for more than 30 s
  while the fault lasted and until recovery. A fault that takes the lease store
  away stops every partition by design (no lease can be proved), so for the two
  database faults the window starts at the fault's end.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, text

from sco_harness.chaos import audit
from sco_harness.controlplane import (
    REPLICAS,
    ControlPlaneRun,
    committed_events,
    ready_servers,
    spot_servers,
    start_control_plane,
    wait_for,
)
from sco_harness.faults import FaultResult
from sco_harness.faults.proxy import FaultProxy
from sco_harness.kafka_broker import TansuBroker, free_port
from sco_harness.openstack_stack import NovaStack
from sco_harness.patroni import PatroniCluster

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}
PARTITIONS = 6
TARGET = 2
STALL_S = 30.0
LEASE_TTL_S = 15.0
_SERIES = re.compile(
    r'^(sco_cycle_seconds_count|sco_partition_degraded)\{partition="([^"]+)"\} (.*)$'
)


def log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- watching cycles


@dataclass
class Cycles:
    """Every partition's completed cycles, from the replicas' /metrics every 0.5 s:
    (when, degraded) each time a replica's count for it went up."""

    run: ControlPlaneRun
    at_target: Callable[[], bool]
    seen: dict[str, list[tuple[float, bool]]] = field(default_factory=lambda: defaultdict(list))
    targets: list[tuple[float, bool]] = field(default_factory=list)
    _counts: dict[tuple[str, str], float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Cycles:
        threading.Thread(target=self._watch, daemon=True).start()
        threading.Thread(target=self._watch_target, daemon=True).start()
        return self

    def _watch_target(self) -> None:
        while not self._stop.wait(1.0):
            self.targets.append((time.time(), self.at_target()))

    def recovered_at(self, t: float) -> float | None:
        """The first look (every second) at the fleet at target once every partition
        had cycled undegraded after `t`: at most a second late, never early."""
        healthy = self.healthy_since(t)
        if healthy is None:
            return None
        return next((at for at, ok in list(self.targets) if at >= healthy and ok), None)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for name in list(self.run.procs):
                if name.startswith("r"):
                    self._scrape(name, self.run.metrics(name))

    def _scrape(self, replica: str, metrics: str) -> None:
        now = time.time()
        counts: dict[str, float] = {}
        degraded: dict[str, bool] = {}
        for line in metrics.splitlines():
            m = _SERIES.match(line)
            if m is None:
                continue
            if m[1] == "sco_cycle_seconds_count":
                counts[m[2]] = float(m[3])
            else:
                degraded[m[2]] = float(m[3]) > 0
        for partition, n in counts.items():
            before = self._counts.get((replica, partition))
            self._counts[(replica, partition)] = n
            if before is None or n > before:
                self.seen[partition].append((now, degraded.get(partition, False)))

    def healthy_since(self, t: float) -> float | None:
        """When every partition had completed a non-degraded cycle after `t`."""
        firsts = []
        for i in range(PARTITIONS):
            ok = [at for at, bad in self.seen.get(f"p{i}", []) if at >= t and not bad]
            if not ok:
                return None
            firsts.append(ok[0])
        return max(firsts)

    def stalled(self, since: float, until: float) -> list[str]:
        """Partitions that went more than STALL_S without a completed cycle in [since, until]."""
        out = []
        for i in range(PARTITIONS):
            times = [since] + [at for at, _ in self.seen.get(f"p{i}", []) if since < at < until]
            times.append(until)
            if max(b - a for a, b in itertools.pairwise(times)) > STALL_S:
                out.append(f"p{i}")
        return out


# ---------------------------------------------------------------- the world


@dataclass
class World:
    folder: Path
    stack: NovaStack
    cluster: PatroniCluster
    broker: TansuBroker
    kafka: FaultProxy
    nova: FaultProxy
    placement: FaultProxy
    db: list[FaultProxy]
    run: ControlPlaneRun
    url: str  # direct to the cluster: for audits
    history_url: str
    ports: dict[str, int] = field(default_factory=dict)
    churn_paused: threading.Event = field(default_factory=threading.Event)
    reclaims: int = 0

    def spot(self) -> list[dict[str, Any]]:
        return spot_servers(self.stack.servers(tags="sco"))

    def at_target(self) -> bool:
        try:
            ready = ready_servers(self.url)
            return len([s for s in self.spot() if s["id"] in ready]) >= PARTITIONS * TARGET
        except Exception:  # the database or Nova mid-fault: not yet
            return False

    def history_ids(self) -> set[str]:
        from sco.adapters.clickhouse.history import ClickHouseHistory

        history = ClickHouseHistory(self.history_url)
        try:
            return history.event_ids()
        finally:
            history.close()

    def churn(self, stop: threading.Event, every_s: float) -> None:
        """Reclaim one random spot server every `every_s`, as a reclaimer without notice."""
        rng = random.Random(17)
        while not stop.wait(every_s):
            if self.churn_paused.is_set():
                continue
            try:
                victims = self.spot()
                if victims:
                    sid = rng.choice(victims)["id"]
                    self.stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
                    self.reclaims += 1
                    log(f"churn: reclaimed {sid}")
            except Exception as e:
                log(f"churn: {type(e).__name__}: {e}")

    def start_replica(self, name: str, env: dict[str, str] | None = None) -> None:
        port = self.ports.setdefault(name, free_port())
        self.run.start(
            name, "run", "--replica", name, "--metrics-port", str(port), port=port, env=env
        )

    def restart_history(self) -> None:
        port = self.ports["history"]
        self.run.start("history", "history", "load", "--port", str(port), port=port)


@contextmanager
def world(folder: Path, base_port: int) -> Iterator[World]:
    started = time.monotonic()
    cluster = PatroniCluster().start()
    # Every client reaches the broker through a proxy (the broker advertises it), so
    # "down" cuts it off from everyone while it keeps its topics: this build of the
    # test broker holds them in memory only, which a real Kafka, on disk, does not.
    broker_port = free_port()
    kafka = FaultProxy(("127.0.0.1", broker_port)).start()
    broker = TansuBroker(folder / "tansu").start(broker_port, advertised_port=kafka.port)
    stack = NovaStack(folder / "nova", base_port, HALLS, 4)
    proxies: list[FaultProxy] = [kafka]
    run: ControlPlaneRun | None = None
    try:
        stack.up()
        log(f"Patroni, tansu and Nova up in {time.monotonic() - started:.0f} s")
        nova = FaultProxy(("127.0.0.1", base_port)).start()
        placement = FaultProxy(("127.0.0.1", base_port + 1)).start()
        db = [FaultProxy(("127.0.0.1", n.pg_port)).start() for n in cluster.nodes]
        proxies += [nova, placement, *db]
        run = ControlPlaneRun(
            folder / "cp",
            _config(folder, stack, kafka, nova, placement, db),
            dict(os.environ),
        )
        w = World(
            folder,
            stack,
            cluster,
            broker,
            kafka,
            nova,
            placement,
            db,
            run,
            cluster.url(),
            run.config["history"]["url"],
        )
        start_control_plane(run, score_every="60s")
        w.ports = {n: p.port for n, p in run.procs.items() if p.port is not None}
        yield w
    finally:
        if run is not None:
            run.stop_all()
        for p in proxies:
            p.stop()
        stack.down()
        broker.stop()
        cluster.stop()


def _config(
    folder: Path,
    stack: NovaStack,
    kafka: FaultProxy,
    nova: FaultProxy,
    placement: FaultProxy,
    db: list[FaultProxy],
) -> dict[str, Any]:
    clouds = yaml.safe_load(stack.clouds_yaml.read_text())
    cloud = clouds["clouds"]["sco-test"]
    for key, proxy in (("compute", nova), ("placement", placement)):
        cloud[f"{key}_endpoint_override"] = cloud[f"{key}_endpoint_override"].replace(
            f":{proxy.upstream[1]}", f":{proxy.port}"
        )
    cloud["auth"]["endpoint"] = cloud["compute_endpoint_override"]
    clouds_file = folder / "clouds-via-proxies.yaml"
    clouds_file.write_text(yaml.safe_dump(clouds))
    region_file = folder / "region.yaml"
    region_file.write_text(yaml.safe_dump(stack.region()))
    hosts = "&".join(f"host=127.0.0.1:{p.port}" for p in db)
    return {
        "state": {
            "url": f"postgresql+psycopg://postgres@/postgres?{hosts}"
            "&target_session_attrs=read-write&connect_timeout=3"
        },
        "events": {
            "kind": "kafka",
            "kafka": {
                "brokers": f"127.0.0.1:{kafka.port}",
                "topic_prefix": f"sco.faults{uuid.uuid4().hex[:6]}.",
            },
        },
        "history": {"url": f"chdb://{folder / 'history'}"},
        "leases": {"kind": "database", "ttl_s": LEASE_TTL_S},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region_file),
            "clouds_file": str(clouds_file),
        },
        "partitions": [
            {
                "name": f"p{i}",
                "kind": "slurm",
                "target_units": TARGET,
                "floor_units": 1,
                "max_units": TARGET,
            }
            for i in range(PARTITIONS)
        ],
        "policy": {"interval_s": 3},
        "log": {"level": "info"},
    }


# ---------------------------------------------------------------- the faults


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[World], float]  # the fault, held; returns when it ended
    starves_leases: bool = False  # takes the lease store away: every partition stops


def _hold(on: Callable[[], object], off: Callable[[], object], hold_s: float) -> float:
    on()
    try:
        time.sleep(hold_s)
    finally:
        off()
    return time.time()


def nova_5xx(hold_s: float) -> Fault:
    return Fault(
        "nova_5xx_storm",
        lambda w: _hold(lambda: w.nova.set("error"), lambda: w.nova.set("pass"), hold_s),
    )


def nova_slow(hold_s: float) -> Fault:
    return Fault(
        "nova_answers_in_10s",
        lambda w: _hold(
            lambda: w.nova.set("slow", delay_s=10.0), lambda: w.nova.set("pass"), hold_s
        ),
    )


def placement_down(hold_s: float) -> Fault:
    return Fault(
        "placement_down",
        lambda w: _hold(lambda: w.placement.set("refuse"), lambda: w.placement.set("pass"), hold_s),
    )


def kafka_down(hold_s: float) -> Fault:
    def inject(w: World) -> float:
        return _hold(lambda: w.kafka.set("refuse"), lambda: w.kafka.set("pass"), hold_s)

    return Fault("kafka_down_60s" if hold_s >= 60 else f"kafka_down_{hold_s:.0f}s", inject)


def history_down(hold_s: float) -> Fault:
    def kill(w: World) -> None:
        popen = w.run.procs["history"].popen
        popen.send_signal(signal.SIGKILL)
        popen.wait()

    return Fault(
        "chdb_unavailable",
        lambda w: _hold(lambda: kill(w), w.restart_history, hold_s),
    )


def clock_skew(hold_s: float) -> Fault:
    """rb restarts 2 s ahead of ra, then ra is lost: rb takes ra's partitions on its
    own clock. Both restart plain afterwards."""

    def inject(w: World) -> float:
        a, b = REPLICAS
        w.run.stop(b)
        # Wall clock only: a faked monotonic clock hangs Python's timed waits.
        skewed = {
            "LD_PRELOAD": faketime_library(),
            "FAKETIME": "+2s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        w.start_replica(b, env=skewed)
        wait_for(lambda: _leaders(w) == {a, b}, 60, "both replicas leading")
        killed = time.time()
        w.run.procs[a].popen.send_signal(signal.SIGKILL)
        w.run.procs[a].popen.wait()
        time.sleep(hold_s)
        w.start_replica(a)
        wait_for(lambda: _leaders(w) == {a, b}, 60, "both replicas leading again")
        w.run.stop(b)
        w.start_replica(b)
        return killed

    return Fault("clock_skew_2s_and_a_replica_lost", inject)


def faketime_library() -> str:
    """libfaketime's path, installed from Debian if it is not (scripts/faults)."""
    from sco_harness.openstack_stack import ROOT

    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "faults" / "install.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def db_unreachable(hold_s: float) -> Fault:
    def on(w: World) -> None:
        for p in w.db:
            p.set("refuse")

    def off(w: World) -> None:
        for p in w.db:
            p.set("pass")

    return Fault(
        f"database_unreachable_{hold_s:.0f}s",
        lambda w: _hold(lambda: on(w), lambda: off(w), hold_s),
        starves_leases=True,
    )


def pg_failover() -> Fault:
    def inject(w: World) -> float:
        killed = time.time()
        node = w.cluster.kill_primary()
        log(f"killed the primary {node.name}")
        return killed

    return Fault("postgres_primary_failover", inject, starves_leases=True)


def matrix(short: bool) -> list[Fault]:
    hold = 10.0 if short else 30.0
    return [
        nova_5xx(hold),
        nova_slow(hold),
        placement_down(hold),
        kafka_down(15.0 if short else 60.0),
        history_down(hold),
        clock_skew(hold),
        db_unreachable(hold),
        pg_failover(),
    ]


# ---------------------------------------------------------------- measuring


def _leaders(w: World) -> set[str]:
    now = time.time()
    engine = create_engine(w.url)
    try:
        with engine.connect() as c:
            rows = c.execute(
                text("SELECT holder FROM leases WHERE expires_at >= :n"), {"n": now}
            ).all()
    finally:
        engine.dispose()
    return {r.holder for r in rows}


def _caught_up(w: World, timeout_s: float) -> set[str]:
    """Committed event ids still missing from history after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = committed_events(w.url) - w.history_ids()
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(2)


def _settled_audit(w: World, timeout_s: float = 30.0) -> dict[str, int]:
    """The cloud against fleet state once creates and deletes in flight have landed:
    a server counts as leaked only if it stays without a record."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = audit(w.url, w.stack.servers(tags="sco"))
        if found["leaked_servers"] == 0 or time.monotonic() > deadline:
            return found
        time.sleep(2)


def measure(w: World, fault: Fault, before: dict[str, int], recover_s: float) -> FaultResult:
    wait_for(w.at_target, 300, "the fleet at target before the fault", every_s=1)
    cycles = Cycles(w.run, w.at_target).start()
    try:
        wait_for(lambda: cycles.healthy_since(time.time() - 60), 120, "healthy cycles")
        started = time.time()
        log(f"{fault.name}: injecting")
        ended = fault.inject(w)
        # Reclaims load the fault; from its end, recovery is of what it disturbed.
        w.churn_paused.set()
        log(f"{fault.name}: ended after {ended - started:.0f} s; waiting for recovery")
        recovered_at = float(
            wait_for(
                lambda: cycles.recovered_at(ended),
                recover_s,
                f"recovery from {fault.name}",
                every_s=0.5,
            )
        )
        stalled = cycles.stalled(ended if fault.starves_leases else started, recovered_at)
    finally:
        cycles.stop()
    try:
        missing = _caught_up(w, 90)
        found = _settled_audit(w)
    finally:
        w.churn_paused.clear()
    result = FaultResult(
        fault=fault.name,
        recovery_s=max(0.0, recovered_at - ended),
        recovered_when="every partition cycled undegraded and the fleet was at target",
        lost_transitions=found["lost_transitions"] - before.get("lost_transitions", 0),
        lost_events=len(missing),
        duplicate_creates=found["duplicate_creates"] - before.get("duplicate_creates", 0),
        leaked_servers=found["leaked_servers"],
        stalled_partitions=len(stalled),
        details={
            "fault_s": round(ended - started, 1),
            "cycling_undegraded_s": round((cycles.healthy_since(ended) or ended) - ended, 2),
            "stalled": stalled,
            "reclaims_so_far": w.reclaims,
            "transitions_so_far": found["history_rows"],
        },
    )
    before.update(found)
    log(f"{fault.name}: {result.as_dict()}")
    return result


def run(
    folder: Path, *, short: bool = False, base_port: int = 19100, only: list[str] | None = None
) -> list[FaultResult]:
    faults = [f for f in matrix(short) if not only or any(o in f.name for o in only)]
    results: list[FaultResult] = []
    with world(folder, base_port) as w:
        stop = threading.Event()
        threading.Thread(target=w.churn, args=(stop, 20.0), daemon=True).start()
        before: dict[str, int] = {}
        try:
            for fault in faults:
                results.append(measure(w, fault, before, recover_s=180))
        finally:
            stop.set()
    return results
