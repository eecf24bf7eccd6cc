"""The soak's run: the events it causes (replica kills, reclaims, the Patroni
primary's kill), its phases (the soak, the rolling stops) and its results, with
the shape of the control plane it runs (bench/soak.py's docstring)."""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from sco_harness.controlplane import ControlPlaneRun, ready_servers, spot_servers, wait_for
from sco_harness.kafka_broker import free_port
from sco_harness.openstack_stack import NovaStack
from sco_harness.patroni import PatroniCluster
from soaklib.watch import Cycles, Leases, Memory, log

PARTITIONS = 6
TARGET = 2
LEASE_TTL_S = 15.0
INTERVAL_S = 2.0
FIRST = ("ra", "rb", "rc")
SPARED = "ra"  # never killed: one replica's memory over the whole run


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
