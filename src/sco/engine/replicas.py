"""Several `sco run` replicas sharing the partitions, a leader per partition.

Each replica heartbeats, holds the leases of a fair share of the partitions
(ceil(partitions / live replicas)), renews them every second, takes over
leases that expired, and hands back leases above its share so a replica that
joins gets work. It runs a partition's controller only while it holds that
partition's lease with time to spare, and every write carries the lease's
fencing token, which the database checks (`sco.ports.FencedOut`).

Each partition it leads cycles on a thread of its own (`sco.engine.loops`),
so a slow create in one partition never holds up another; the signal pump
(`sco.engine.pump`) relays the outbox and wakes the partitions when a new
exclusion or score generation lands.

When the database cannot be reached the replica cannot prove its leases, so
it stops all its controllers; it takes the leases up again (the same tokens,
if they did not expire meanwhile) when the database is back.

Runners are made by `sco.engine.builder` only, which gives each the controllers'
maker and where their creates and deletes run.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from sco.domain.demand import Partition
from sco.engine.controller import PartitionController
from sco.engine.cycle import CycleReport
from sco.engine.loops import PartitionLoops, describe
from sco.engine.metrics import PlacementMetrics
from sco.engine.pump import SignalPump
from sco.engine.signals import FleetSignals
from sco.ports import Clock, Fence, FencedOut, Lease, LeaseStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    name: str
    lease_ttl_s: float = 15.0
    lease_every_s: float = 0.5  # renew and look for free leases this often
    # A replica that stops heartbeating leaves the membership after this long, well
    # before its leases expire: by then the survivors' fair share has room for them.
    heartbeat_ttl_s: float | None = None  # default: a third of the lease TTL
    act_margin_s: float = 5.0  # a cycle starts only with this much lease left
    stuck_after_s: float = 300.0  # a cycle running this long means the replica is stuck

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a replica needs a name")
        if not 0 < self.act_margin_s < self.lease_ttl_s:
            raise ValueError("act_margin_s must be in (0, lease_ttl_s)")
        if not 0 < self.lease_every_s < self.lease_ttl_s - self.act_margin_s:
            raise ValueError("lease_every_s must leave the margin: < lease_ttl_s - act_margin_s")


FENCED_STALL = 3  # a partition refused this many times in a row makes the replica unready


def fair_share(partitions: int, replicas: int) -> int:
    return math.ceil(partitions / max(replicas, 1))


def _why_taken(was: Lease | None, orphan: bool, share: int, now: float) -> str:
    """Why a lease was free to take, for the log line that says it was."""
    if was is None:
        return "never held before"
    if orphan:
        return (
            f"{was.holder} let it expire {now - was.expires_at:.0f} s ago unreleased "
            "(stopped or cut off): taken beyond the fair share"
        )
    if was.holder == "":
        return f"handed back by its holder; within this replica's fair share of {share}"
    return f"{was.holder}'s lease expired {now - was.expires_at:.0f} s ago"


def _spread(name: str, partition: str) -> str:
    """A per-replica order of partitions, so replicas reach for different ones first."""
    return hashlib.sha256(f"{name}/{partition}".encode()).hexdigest()


class ReplicaRunner:
    def __init__(
        self,
        *,
        config: ReplicaConfig,
        leases: LeaseStore,
        partitions: Sequence[Partition],
        controller: Callable[[Partition, Fence], PartitionController],
        signals: FleetSignals,
        clock: Clock,
        interval_s: float,
        calls: Executor,
        metrics: PlacementMetrics | None = None,
        on_report: Callable[[CycleReport], None] | None = None,
        pump: Callable[[Callable[[], None]], SignalPump] | None = None,
        cycles: int | None = None,
    ) -> None:
        """`controller(partition, fence)` makes a partition's controller when its lease
        is taken, writing with `fence`; `calls` runs the controllers' creates and
        deletes (shut down when `run` ends); `pump(wake)` builds this replica's signal
        pump, given what wakes its loops; `cycles` ends each partition's loop after that
        many cycles (one-shot runs)."""
        self.config = config
        self.metrics = metrics
        self.leases = leases
        self.clock = clock
        self.interval_s = interval_s
        self.calls = calls
        self._controller = controller
        self._signals = signals
        self._on_report = on_report
        self.partitions: dict[str, Partition] = {p.name: p for p in partitions}
        self.held: dict[str, Lease] = {}
        self._fences: dict[str, Fence] = {}  # the token each held partition is written with
        self._taken_at: dict[str, float] = {}  # when each held lease was taken
        self.fenced: dict[str, int] = {}  # partition -> times its writes were refused
        self._fenced_run: dict[str, int] = {}  # ... since its last cycle that ended well
        self.controllers: dict[str, PartitionController] = {}
        # The controllers of partitions whose lease was lost: the next controller of one
        # here records the answers of the calls it sent.
        self._dropped: dict[str, PartitionController] = {}
        self._lock = threading.Lock()
        self.loops = PartitionLoops(
            interval_s,
            on_report=self._report,
            may_act=lambda name: name in self.actable(),
            on_fenced=self._fenced,
            cycles=cycles,
        )
        self.pump = pump(self._signals_moved) if pump is not None else None
        self._threads = False  # whether `run` started the loops (tests drive cycles by hand)
        self._tended_at = time.monotonic()
        self._tend_ok = False
        self._unreachable_since: float | None = None  # monotonic; None while it answers
        self._next_expiry: float | None = None  # when a lease held elsewhere expires

    @property
    def signals(self) -> FleetSignals:
        return self._signals

    def _signals_moved(self) -> None:
        """New exclusions or intents: every partition reads them and cycles now."""
        self._signals.invalidate()
        self.loops.wake_all()

    def token(self, partition: str) -> int:
        """The fencing token this replica writes `partition` with (0: none)."""
        with self._lock:
            fence = self._fences.get(partition)
            return fence.token if fence is not None and partition in self.held else 0

    def _report(self, report: CycleReport) -> None:
        self._fenced_run.pop(report.partition, None)
        if self.metrics is not None:
            self.metrics.observe(report)
        if self._on_report is not None:
            self._on_report(report)

    # ------------------------------------------------------------ leases

    def _note(self, partition: str, event: str, token: int, why: str) -> None:
        log.info(
            "replica %s: lease of %s %s (token %d): %s",
            self.config.name, partition, event, token, why,
        )  # fmt: skip

    def tend_leases(self) -> None:
        """Heartbeat, renew, hand back above the fair share, take up free leases."""
        c = self.config
        now = self.clock.now()
        try:
            self.leases.heartbeat(c.name, c.heartbeat_ttl_s or c.lease_ttl_s / 3, now)
            live = self.leases.live_replicas(now)
            self._renew(now)
            share = fair_share(len(self.partitions), len(live))
            self._shed(share, len(live), now)
            self._take(share, now)
        except Exception as e:  # the database is unreachable: nothing can be proven
            first = self._unreachable_since is None
            if first:
                self._unreachable_since = time.monotonic()
            self._tend_ok = False
            # Its cause named once (a full disk, a refused connection), not every round.
            self._drop_all(f"lease store unreachable ({describe(e)})", say=first)
        else:
            if self._unreachable_since is not None:
                log.warning(
                    "replica %s: lease store reachable again after %.0f s",
                    c.name,
                    time.monotonic() - self._unreachable_since,
                )
                self._unreachable_since = None
            self._tend_ok = True
        self._tended_at = time.monotonic()
        if self.metrics is not None:
            self.metrics.leading(c.name, self.partitions, self.held)

    def _renew(self, now: float) -> None:
        for name, lease in list(self.held.items()):
            renewed = self.leases.renew(lease, self.config.lease_ttl_s, now)
            if renewed is None:
                self._drop(name, "lost", "renewal refused: it expired or another replica holds it")
            else:
                with self._lock:
                    self.held[name] = renewed

    def _shed(self, share: int, replicas: int, now: float) -> None:
        """Hand back what is above the fair share, but not a lease taken less than a TTL
        ago (an orphan this replica rescued waits for a replica with room to be up)."""
        settled = [
            p
            for p in self.held
            if now - self._taken_at.get(p, -math.inf) >= self.config.lease_ttl_s
        ]
        extra = len(self.held) - share
        why = (
            f"above this replica's fair share of {share} ({len(self.partitions)} partitions, "
            f"{replicas} live replicas): another takes it"
        )
        for name in sorted(settled, key=lambda p: _spread(self.config.name, p))[: max(extra, 0)]:
            lease = self.held[name]
            self._drop(name, "released", why)
            self.leases.release(lease)

    def _take(self, share: int, now: float) -> None:
        """Up to the fair share of free leases: every lease first, then a controller for
        each (building one takes a while: a second lease must not wait for it)."""
        free = [p for p in self.partitions if p not in self.held]
        taken: list[tuple[str, str]] = []  # (partition, why)
        held_elsewhere = False
        # One read of every lease: a partition another replica holds is not raced for
        # (an acquire that must fail costs several writes, every tend, per partition).
        known = {x.partition: x for x in (self.leases.leases() if free else ())}
        others = {
            p: x.expires_at
            for p, x in known.items()
            if p in self.partitions and x.holder != self.config.name and x.expires_at >= now
        }
        for name in sorted(free, key=lambda p: _spread(self.config.name, p)):
            # An orphan (a lease that expired unreleased: its replica died) is taken
            # beyond the fair share: the replica with room for it may still be starting.
            orphan = (
                name in known
                and name not in others
                and known[name].holder != ""  # not handed back: its holder died
                and now - known[name].expires_at <= 4 * self.config.lease_ttl_s
            )
            if len(self.held) >= share and not orphan:
                continue
            if self.loops.busy(name):
                continue  # its last controller is finishing a cycle: not two at once
            if name in others:
                held_elsewhere = True
                continue
            lease = self.leases.acquire(name, self.config.name, self.config.lease_ttl_s, now)
            if lease is None:
                held_elsewhere = True
                continue
            # With leases kept elsewhere (Kubernetes) the database learns the token here,
            # and a Lease that counts from 1 again writes above what it has seen.
            fence = self.leases.claim_fence(
                name, self.config.name, lease.token, lease.expires_at, now
            )
            if fence is None:
                # Fleet state says a replica of the other lease kind holds it (a rolling
                # change of lease kind): it keeps it until its claim lapses.
                self.leases.release(lease)
                held_elsewhere = True
                continue
            if fence != lease.token:
                log.info(
                    "replica %s: %s's lease has token %d, the database has seen larger: "
                    "writing with %d",
                    self.config.name,
                    name,
                    lease.token,
                    fence,
                )
            with self._lock:
                self.held[name] = lease
                self._fences[name] = Fence(name, fence)
            self._taken_at[name] = now
            taken.append((name, _why_taken(known.get(name), orphan, share, now)))
        # Room left, and leases held elsewhere: look again when the first of them
        # expires (a dead replica's), not a tend interval later.
        self._next_expiry = min(others.values(), default=None) if held_elsewhere else None
        for name, why in taken:
            controller = self._controller(self.partitions[name], self._fences[name])
            before = self._dropped.pop(name, None)
            if before is not None:  # its last cycle is over (`loops.busy`)
                controller.acquirer.take_over(before.acquirer)
            with self._lock:
                self.controllers[name] = controller
            self._note(name, "acquired", self.token(name), why)
            if self._threads:
                self.loops.start(name, controller)

    def _until_next_tend(self) -> float:
        """A tend interval, or less: until just after the next lease that may become
        free expires."""
        every = self.config.lease_every_s
        if self._next_expiry is None:
            return every
        return min(every, max(0.0, self._next_expiry - self.clock.now()) + 0.01)

    def _drop(self, name: str, event: str, why: str) -> None:
        with self._lock:
            lease = self.held.pop(name, None)
            held = self._fences.pop(name, None)
            fence = held.token if held is not None else 0
            if held is not None:
                held.revoke()  # a cycle still under way writes nothing more
            dropped = self.controllers.pop(name, None)
            if dropped is not None:
                self._dropped[name] = dropped
        self.loops.stop(name)
        if self.metrics is not None:
            self.metrics.forget(name)
            self.metrics.leading(self.config.name, [name], ())  # not at the next tend: now
        if lease is not None:
            self._note(name, event, fence, why)

    def _fenced(self, name: str, e: FencedOut) -> None:
        """The database refused a write of `name`'s: another writer holds a newer token.
        The partition's controller stops at once (it acts on nothing more), the leader
        metric drops, and the lease loop takes it up again only through a new claim."""
        log.warning(
            "replica %s: %s fenced out, its controller stops: %s", self.config.name, name, e
        )
        self.fenced[name] = self.fenced.get(name, 0) + 1
        self._fenced_run[name] = self._fenced_run.get(name, 0) + 1
        if self.metrics is not None:
            self.metrics.fenced.labels(name).inc()
        self._drop(name, "fenced", "the database refused a write: a newer token exists")

    def _drop_all(self, why: str, say: bool = False) -> None:
        if self.held or say:
            log.warning("replica %s: %s; stopping all partitions", self.config.name, why)
        for name in list(self.held):
            self._drop(name, "unprovable", "it cannot be renewed, so nor proven held")

    # ------------------------------------------------------------ cycles

    def actable(self) -> list[str]:
        """Partitions whose lease has more than the margin left."""
        now = self.clock.now()
        with self._lock:
            return [
                p
                for p, lease in self.held.items()
                if lease.expires_at - now > self.config.act_margin_s
            ]

    def cycle_once(self, name: str) -> CycleReport | None:
        """One cycle of a partition this replica leads, on the caller's thread (tests
        step replicas by hand); None when it may not act."""
        with self._lock:
            controller = self.controllers.get(name)
        if controller is None or name not in self.actable():
            return None
        try:
            report = controller.cycle()
        except FencedOut as e:
            self._fenced(name, e)
            return None
        self._report(report)
        return report

    def run(self, stop: threading.Event) -> None:
        """Lead partitions until `stop` is set (or, with `cycles`, until every partition
        it leads has done that many): leases tended every `lease_every_s` on this
        thread, each partition on a thread of its own, the signal pump on another."""
        self._threads = True
        self.tend_leases()
        with self._lock:
            held = dict(self.controllers)
        for name, controller in held.items():
            self.loops.start(name, controller)
        if self.pump is not None:
            self.pump.start()
        try:
            while not stop.wait(self._until_next_tend()):
                try:
                    self.tend_leases()
                except Exception:
                    log.exception("replica %s: tending leases failed", self.config.name)
                if self.loops.cycles is not None and self.held and self.loops.done():
                    return
        finally:
            self.loops.stop_all(wait_s=self.config.lease_ttl_s)
            if self.pump is not None:
                self.pump.stop()
            # Calls not yet sent are dropped: their records are REQUESTED (or
            # TERMINATING), which the next leader's listing settles.
            self.calls.shutdown(wait=False, cancel_futures=True)

    def health(self) -> tuple[bool, str]:
        """Live while no partition's cycle has been running for `stuck_after_s` (API
        timeouts and Nova's scheduler wait are far shorter) and leases are tended."""
        stale = self.loops.stalest_s()
        if stale > self.config.stuck_after_s + self.interval_s:
            return False, f"a partition has not finished a cycle in {stale:.0f}s"
        since = time.monotonic() - self._tended_at
        if since > self.config.stuck_after_s:
            return False, f"leases not tended for {since:.0f}s"
        return True, f"leading {len(self.held)} of {len(self.partitions)} partitions"

    def ready(self) -> tuple[bool, str]:
        """Ready while the lease store answers (the replica can prove its leases) and no
        partition it takes keeps being refused by the database's fence."""
        if not self._tend_ok:
            return False, "the lease store is unreachable"
        stalled = sorted(p for p, n in self._fenced_run.items() if n >= FENCED_STALL)
        if stalled:
            return False, (
                f"writes to {', '.join(stalled)} refused {FENCED_STALL} times in a row "
                "(another writer holds a newer fencing token)"
            )
        return True, f"leading {len(self.held)} of {len(self.partitions)} partitions"

    def shutdown(self) -> None:
        """Hand every lease back, so others take over at once rather than after the TTL."""
        for name, lease in list(self.held.items()):
            self._drop(name, "released", "this replica is stopping")
            try:
                self.leases.release(lease)
            except Exception as e:
                log.warning("release of %s failed: %s", name, type(e).__name__)
        try:
            self.leases.forget_replica(self.config.name)
        except Exception as e:
            log.warning("forgetting replica failed: %s", type(e).__name__)
