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
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from sqlalchemy import create_engine, text

from sco_harness.chaos import audit
from sco_harness.controlplane import (
    ControlPlaneRun,
    ready_servers,
    spot_servers,
    start_control_plane,
    stop_and_audit,
    wait_for,
)
from sco_harness.kafka_broker import TansuBroker, free_port
from sco_harness.openstack_stack import NovaStack
from sco_harness.patroni import PatroniCluster
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}
PARTITIONS = 6
TARGET = 2
LEASE_TTL_S = 15.0
INTERVAL_S = 2.0
FIRST = ("ra", "rb", "rc")
SPARED = "ra"  # never killed: one replica's memory over the whole run
_CYCLES = re.compile(r'^sco_partition_last_cycle_timestamp_seconds\{partition="([^"]+)"\} (\S+)$')
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[bench/soak {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- what is watched


@dataclass
class Cycles:
    """Completed cycles per partition, with the replica that ran each: when each ended
    (`sco_partition_last_cycle_timestamp_seconds`, the replica's own clock, this
    machine's), from every live replica's /metrics every `every_s`. A cycle is missed
    only if a replica completes two between scrapes, which the measures below, about
    the first cycle after a gap, never need."""

    ports: Callable[[], dict[str, int]]
    every_s: float = 0.5
    done: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    _last: dict[tuple[str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Cycles:
        threading.Thread(target=self._loop, name="cycles", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for name, port in self.ports().items():
                self._scrape(name, port)

    def _scrape(self, replica: str, port: int) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return
        ended = {m[1]: float(m[2]) for m in map(_CYCLES.match, body.splitlines()) if m}
        with self._lock:
            for key in [k for k in self._last if k[0] == replica and k[1] not in ended]:
                del self._last[key]  # it stopped leading: the series went
            for partition, at in ended.items():
                before = self._last.get((replica, partition))
                self._last[(replica, partition)] = at
                if before is None or at != before:
                    self.done[partition].append((at, replica))

    def last_before(self, partition: str, at: float) -> float | None:
        with self._lock:
            times = [t for t, _ in self.done.get(partition, []) if t < at]
        return max(times) if times else None

    def first_after(self, partition: str, at: float, not_by: str = "") -> float | None:
        with self._lock:
            times = [t for t, r in self.done.get(partition, []) if t >= at and r != not_by]
        return min(times) if times else None

    def gap_s(self, partition: str, at: float, not_by: str = "") -> float | None:
        """From the last cycle before `at` to the first after it (by another than `not_by`)."""
        last, first = self.last_before(partition, at), self.first_after(partition, at, not_by)
        return None if last is None or first is None else first - last

    def leaderless_s(self, partition: str, at: float, not_by: str = "") -> float | None:
        """From `at` (its leader gone) to the first cycle another than `not_by` ended."""
        first = self.first_after(partition, at, not_by)
        return None if first is None else first - at

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.done.values())


@dataclass
class Memory:
    """Every process's RSS every `every_s`: name -> [(time, bytes)], and its start."""

    pids: Callable[[], dict[str, int]]
    every_s: float = 10.0
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))
    started: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Memory:
        threading.Thread(target=self._loop, name="memory", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> None:
        for name, pid in self.pids().items():
            try:
                p = psutil.Process(pid)
                self.started.setdefault(name, p.create_time())
                self.rss[name].append((time.time(), p.memory_info().rss))
            except psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def growth(self, warmup_s: float, measure_s: float) -> dict[str, dict[str, float]]:
        """Per process that lived `warmup_s` + `measure_s`: RSS after its warm-up, at the
        end, and the growth between."""
        out = {}
        for name, samples in self.rss.items():
            start = self.started[name]
            after = [(t, b) for t, b in samples if t >= start + warmup_s]
            if not after or after[-1][0] - after[0][0] < measure_s:
                continue
            first, last = after[0][1], after[-1][1]
            out[name] = {
                "rss_mb_after_warmup": round(first / 2**20, 1),
                "rss_mb_end": round(last / 2**20, 1),
                "growth_pct": round(100 * (last / first - 1), 2),
                "measured_s": round(after[-1][0] - after[0][0]),
            }
        return out


class Leases:
    """The leases table, read directly (every replica writes it)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, pool_pre_ping=True)

    def holders(self) -> dict[str, str]:
        """Partition -> holder, for leases not expired."""
        with self.engine.connect() as c:
            rows = c.execute(
                text("SELECT partition, holder FROM leases WHERE expires_at >= :n"),
                {"n": time.time()},
            ).all()
        return {r.partition: r.holder for r in rows}

    def held_by(self, replica: str, tries: int = 20) -> set[str]:
        for _ in range(tries):
            try:
                return {p for p, h in self.holders().items() if h == replica}
            except Exception as e:  # the database failing over
                log(f"leases not readable: {type(e).__name__}")
                time.sleep(0.5)
        return set()

    def close(self) -> None:
        self.engine.dispose()


# ---------------------------------------------------------------- the run


@dataclass
class Soak:
    run: ControlPlaneRun
    stack: NovaStack
    cluster: PatroniCluster
    url: str
    args: argparse.Namespace
    rng: random.Random = field(default_factory=lambda: random.Random(17))
    replicas: list[str] = field(default_factory=lambda: list(FIRST))  # live ones
    ever: list[str] = field(default_factory=lambda: list(FIRST))
    kills: list[dict[str, Any]] = field(default_factory=list)
    reclaims: list[dict[str, Any]] = field(default_factory=list)
    failover: dict[str, Any] = field(default_factory=dict)
    handovers: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.leases = Leases(self.url)
        self.cycles = Cycles(self.replica_ports).start()
        self.memory = Memory(self.pids).start()
        self.memory.sample()

    def replica_ports(self) -> dict[str, int]:
        return {n: p for n in list(self.replicas) if (p := self.run.procs[n].port) is not None}

    def pids(self) -> dict[str, int]:
        return {n: p.popen.pid for n, p in self.run.procs.items() if p.popen.poll() is None}

    @property
    def want(self) -> int:
        return PARTITIONS * TARGET

    def spot(self) -> list[dict[str, Any]]:
        return spot_servers(self.stack.servers(tags="sco"))

    def at_target(self) -> bool:
        try:
            ready = ready_servers(self.url)
            return len([s for s in self.spot() if s["id"] in ready]) >= self.want
        except Exception:  # the database failing over, Nova busy: not now
            return False

    def start_replica(self) -> str:
        name = f"r{len(self.ever) + 1:02d}"
        port = free_port()
        self.run.start(name, "run", "--replica", name, "--metrics-port", str(port), port=port)
        self.replicas.append(name)
        self.ever.append(name)
        return name

    # ------------------------------------------------------------ events

    def kill(self) -> str:
        victims = [n for n in self.replicas if n != SPARED]
        victim = min(victims, key=self.ever.index)  # the oldest goes
        held = self.leases.held_by(victim)
        at = time.time()
        proc = self.run.procs[victim].popen
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.replicas.remove(victim)
        self.kills.append({"replica": victim, "at": at, "held": sorted(held)})
        log(f"killed {victim} (SIGKILL), holding {sorted(held)}")
        return victim

    def reclaim(self) -> None:
        try:
            victims = self.spot()
            if not victims:
                log("reclaim: no ACTIVE spot server")
                return
            sid = self.rng.choice(victims)["id"]
            r = self.stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
            if r.status_code not in (204, 404):
                raise RuntimeError(f"HTTP {r.status_code}")
        except Exception as e:
            log(f"reclaim skipped: {type(e).__name__}: {e}")
            return
        self.reclaims.append({"server": sid, "at": time.time(), "replaced_at": None})

    def check_replaced(self) -> None:
        pending = [r for r in self.reclaims if r["replaced_at"] is None]
        if pending and self.at_target():
            now = time.time()
            for r in pending:
                r["replaced_at"] = now

    def kill_primary(self) -> None:
        at = time.time()
        node = self.cluster.kill_primary()
        wait_for(lambda: self.cluster.roles() == {"primary", "down"}, 120, "a new primary", 0.2)
        took = time.time() - at
        self.failover = {"at": at, "node": node.name, "failover_s": round(took, 2)}
        log(f"Patroni primary {node.name} killed; new primary after {took:.1f} s")

    # ------------------------------------------------------------ the phases

    def soak(self) -> None:
        a = self.args
        duration = a.minutes * 60
        failover_at = a.failover_at_s if a.failover_at_s is not None else duration * 17 / 30
        start = time.monotonic()
        next_kill, next_reclaim, next_report = a.kill_every_s, a.reclaim_every_s, 60.0
        restart_at: list[float] = []
        failed_over = False
        while (now := time.monotonic() - start) < duration:
            if now >= next_kill:
                self.kill()
                restart_at.append(now + a.restart_after_s)
                next_kill += a.kill_every_s
            if restart_at and now >= restart_at[0]:
                restart_at.pop(0)
                log(f"started {self.start_replica()}")
            if now >= next_reclaim:
                self.reclaim()
                next_reclaim += a.reclaim_every_s
            if not failed_over and now >= failover_at:
                failed_over = True
                self.kill_primary()
            self.check_replaced()
            if now >= next_report:
                next_report += 60.0
                self.progress(now)
            time.sleep(1.0)
        for _ in restart_at:
            log(f"started {self.start_replica()}")
        self.memory.sample()
        self.memory.stop()

    def progress(self, now: float) -> None:
        done = [k for k in self.leaderless() if k["partitions"]]
        worst = max((v for k in done for v in k["partitions"].values() if v), default=0.0)
        replaced = sum(1 for r in self.reclaims if r["replaced_at"] is not None)
        rss = {n: s[-1][1] / 2**20 for n, s in self.memory.rss.items() if s}
        log(
            f"{now / 60:4.1f} min: replicas {self.replicas}, at target {self.at_target()}, "
            f"kills {len(self.kills)}, reclaims {len(self.reclaims)} ({replaced} replaced), "
            f"max leaderless {worst:.1f} s, cycles seen {self.cycles.count()}, "
            f"RSS MB {', '.join(f'{n} {v:.0f}' for n, v in sorted(rss.items()))}"
        )

    def rolling_stops(self, times: int) -> None:
        """SIGTERM a replica, measure how soon each lease it held has another holder,
        start a new one, wait for the replicas to rebalance."""
        for _ in range(times):
            self.balanced(120)
            victim = next(n for n in self.replicas if n != SPARED)
            held = self.leases.held_by(victim)
            at = time.time()
            self.run.procs[victim].popen.send_signal(signal.SIGTERM)
            taken: dict[str, float] = {}
            deadline = time.monotonic() + 60
            while len(taken) < len(held) and time.monotonic() < deadline:
                try:
                    holders = self.leases.holders()
                except Exception:
                    continue
                now = time.time()
                for p in held - set(taken):
                    if holders.get(p) not in (None, victim):
                        taken[p] = now - at
                time.sleep(0.05)
            code = self._exit(victim)
            self.replicas.remove(victim)
            time.sleep(2 * INTERVAL_S + 1)  # the new leaders' first cycles, scraped
            gaps = {p: self.cycles.leaderless_s(p, at, not_by=victim) for p in held}
            self.handovers.append(
                {"replica": victim, "exit": code, "held": sorted(held),
                 "taken_s": {p: round(taken.get(p, float("inf")), 3) for p in sorted(held)},
                 "leaderless_s": {p: _r(g) for p, g in sorted(gaps.items())}}
            )  # fmt: skip
            log(f"SIGTERM {victim}: leases taken over in {taken} (exit {code}); gaps {gaps}")
            log(f"started {self.start_replica()}")

    def _exit(self, name: str, timeout_s: float = 60.0) -> int:
        """The exit status of a replica sent SIGTERM (one signal, as an orchestrator
        sends: a second one during its interpreter's shutdown would kill it)."""
        popen = self.run.procs[name].popen
        try:
            return popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return self.run.stop(name)  # SIGKILL after its grace, as a kubelet does

    def balanced(self, timeout_s: float) -> None:
        def even() -> bool:
            try:
                holders = self.leases.holders()
            except Exception:
                return False
            per = [sum(1 for h in holders.values() if h == n) for n in self.replicas]
            return len(holders) == PARTITIONS and max(per) - min(per) <= 1

        try:
            wait_for(even, timeout_s, "the replicas to share the partitions", every_s=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self._lease_report()}") from None

    def _lease_report(self) -> str:
        """Who holds what, and how each replica that should be running is doing."""
        try:
            holders: object = self.leases.holders()
        except Exception as e:  # the database failing over
            holders = f"unreadable: {type(e).__name__}"
        lines = [f"leases {holders}; replicas {self.replicas}"]
        for name in self.replicas:
            lines.append(f"--- {name} (exit {self.run.procs[name].popen.poll()}):")
            lines.append(self.run.tail(name))
        return "\n".join(lines)

    # ------------------------------------------------------------ results

    def leaderless(self) -> list[dict[str, Any]]:
        out = []
        for k in self.kills:
            held, by = k["held"], k["replica"]
            gone = {p: self.cycles.leaderless_s(p, k["at"], not_by=by) for p in held}
            gaps = {p: self.cycles.gap_s(p, k["at"], not_by=by) for p in held}
            out.append(
                {"replica": by, "partitions": {p: _r(g) for p, g in gone.items()},
                 "cycle_gap_s": {p: _r(g) for p, g in gaps.items()}}
            )  # fmt: skip
        return out

    def result(self) -> dict[str, Any]:
        kills = self.leaderless()
        flat = [v for k in kills for v in k["partitions"].values()]
        measured = [v for v in flat if v is not None]
        mean = statistics.mean(measured) if measured else 0.0
        affected = statistics.mean(len(k["held"]) for k in self.kills) if self.kills else 0.0
        share = affected / PARTITIONS
        month_s = 30 * 86400
        leaderless_month_s = len(FIRST) * 30 * mean * share
        growth = self.memory.growth(self.args.warmup_s, self.args.measure_s)
        full = [g["growth_pct"] for n, g in growth.items() if n in (SPARED, "watch", "history")]
        fo = self.failover
        fo_gaps = (
            {p: _r(self.cycles.leaderless_s(p, fo["at"])) for p in sorted(self.cycles.done)}
            if fo
            else {}
        )
        handover = [t for h in self.handovers for t in h["taken_s"].values()]
        replaced = [r["replaced_at"] - r["at"] for r in self.reclaims if r["replaced_at"]]
        return {
            "minutes": self.args.minutes,
            "replicas": len(FIRST),
            "partitions": PARTITIONS,
            "lease_ttl_s": LEASE_TTL_S,
            "interval_s": INTERVAL_S,
            "kills": kills,
            "leaderless_s": flat,
            "max_leaderless_s": max(measured) if measured else None,
            "mean_leaderless_s": _r(mean),
            "unrecovered_partitions": sum(1 for v in flat if v is None),
            "target_leaderless_s": LEASE_TTL_S + 1,
            "availability_month": round(1 - leaderless_month_s / month_s, 6),
            "availability_formula": (
                f"1 - R*30*L*f/(30*86400), R={len(FIRST)} replicas, L={mean:.2f} s mean "
                f"leaderless per affected partition per crash, f={affected:.2f}/{PARTITIONS} "
                f"partitions a crash affects: {leaderless_month_s:.0f} s a month"
            ),
            "memory_growth": growth,
            "memory_growth_max_pct": max(full) if full else None,
            "handovers": self.handovers,
            "handover_s": handover,
            "max_handover_s": max(handover) if handover else None,
            "failover_s": fo.get("failover_s"),
            "failover_leaderless_s": fo_gaps,
            "reclaims": len(self.reclaims),
            "replaced": len(replaced),
            "replaced_max_s": _r(max(replaced)) if replaced else None,
            "cycles_seen": self.cycles.count(),
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


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
