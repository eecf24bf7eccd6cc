"""Several `sco run` replicas sharing the partitions, a leader per partition.

Each replica heartbeats, holds the leases of a fair share of the partitions
(ceil(partitions / live replicas)), renews them every second, takes over
leases that expired, and hands back leases above its share so a replica that
joins gets work. It runs a partition's controller only while it holds that
partition's lease with time to spare, and every write carries the lease's
fencing token, which the database checks (`sco.ports.FencedOut`).

When the database cannot be reached the replica cannot prove its leases, so
it stops all its controllers; it takes the leases up again (the same tokens,
if they did not expire meanwhile) when the database is back.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import Policy
from sco.domain.demand import Partition
from sco.ports import (
    Clock,
    DemandSource,
    FencedOut,
    Lease,
    LeaseManager,
    Provider,
    SchedulerCluster,
)
from sco.runtime.controller import ControllerConfig, CycleReport, PartitionController
from sco.runtime.metrics import PlacementMetrics
from sco.runtime.realtime import ControllerKit, SignalRelay

log = logging.getLogger(__name__)


class Membership(LeaseManager, Protocol):
    def heartbeat(self, name: str, ttl_s: float, now: float) -> None: ...

    def live_replicas(self, now: float) -> list[str]: ...

    def forget_replica(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    name: str
    lease_ttl_s: float = 15.0
    lease_every_s: float = 0.5  # renew and look for free leases this often
    # A replica that stops heartbeating leaves the membership after this long, well
    # before its leases expire: by then the survivors' fair share has room for them.
    heartbeat_ttl_s: float | None = None  # default: a third of the lease TTL
    act_margin_s: float = 5.0  # a cycle starts only with this much lease left

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a replica needs a name")
        if not 0 < self.act_margin_s < self.lease_ttl_s:
            raise ValueError("act_margin_s must be in (0, lease_ttl_s)")
        if not 0 < self.lease_every_s < self.lease_ttl_s - self.act_margin_s:
            raise ValueError("lease_every_s must leave the margin: < lease_ttl_s - act_margin_s")


@dataclass(frozen=True, slots=True)
class LeaseChange:
    at: float
    partition: str
    event: str  # "acquired", "renewed", "lost", "released", "unprovable"
    token: int


def fair_share(partitions: int, replicas: int) -> int:
    return math.ceil(partitions / max(replicas, 1))


def _spread(name: str, partition: str) -> str:
    """A per-replica order of partitions, so replicas reach for different ones first."""
    return hashlib.sha256(f"{name}/{partition}".encode()).hexdigest()


class ReplicaRunner:
    def __init__(
        self,
        *,
        config: ReplicaConfig,
        leases: Membership,
        provider: Provider,
        nodes: SchedulerCluster,
        store: SqlFleetStore,
        demand: DemandSource,
        policy: Callable[[], Policy],
        clock: Clock,
        interval_s: float,
        controller: ControllerConfig | None = None,
        on_lease: Callable[[LeaseChange], None] | None = None,
        metrics: PlacementMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.leases = leases
        self.store = store
        self.clock = clock
        self.interval_s = interval_s
        self.on_lease = on_lease
        self.partitions: dict[str, Partition] = {p.name: p for p in demand.partitions()}
        self.held: dict[str, Lease] = {}
        self.controllers: dict[str, PartitionController] = {}
        self._lock = threading.Lock()
        store.fence = self.token
        pools = list(provider.pools())
        store.upsert_pools(pools)
        self._kit = ControllerKit(provider, nodes, store, demand, policy, clock, controller)
        self._relay = SignalRelay(store, pools, self._kit.signals.update)

    def token(self, partition: str) -> int:
        with self._lock:
            lease = self.held.get(partition)
        return lease.token if lease else 0

    # ------------------------------------------------------------ leases

    def _note(self, partition: str, event: str, token: int) -> None:
        log.info("replica %s: lease of %s %s (token %d)", self.config.name, partition, event, token)
        if self.on_lease is not None:
            self.on_lease(LeaseChange(self.clock.now(), partition, event, token))

    def tend_leases(self) -> None:
        """Heartbeat, renew, hand back above the fair share, take up free leases."""
        c = self.config
        now = self.clock.now()
        try:
            self.leases.heartbeat(c.name, c.heartbeat_ttl_s or c.lease_ttl_s / 3, now)
            live = self.leases.live_replicas(now)
            self._renew(now)
            share = fair_share(len(self.partitions), len(live))
            self._shed(share)
            self._take(share, now)
        except Exception as e:  # the database is unreachable: nothing can be proven
            self._drop_all(f"lease store unreachable ({type(e).__name__})")

    def _renew(self, now: float) -> None:
        for name, lease in list(self.held.items()):
            renewed = self.leases.renew(lease, self.config.lease_ttl_s, now)
            if renewed is None:
                self._drop(name, "lost")
            else:
                with self._lock:
                    self.held[name] = renewed

    def _shed(self, share: int) -> None:
        extra = len(self.held) - share
        for name in sorted(self.held, key=lambda p: _spread(self.config.name, p))[: max(extra, 0)]:
            lease = self.held[name]
            self._drop(name, "released")
            self.leases.release(lease)

    def _take(self, share: int, now: float) -> None:
        free = [p for p in self.partitions if p not in self.held]
        for name in sorted(free, key=lambda p: _spread(self.config.name, p)):
            if len(self.held) >= share:
                return
            lease = self.leases.acquire(name, self.config.name, self.config.lease_ttl_s, now)
            if lease is None:
                continue
            # With leases kept elsewhere (Kubernetes) the database learns the token here.
            self.store.raise_fence(name, lease.token)
            controller = self._kit.controller(self.partitions[name])
            with self._lock:
                self.held[name] = lease
                self.controllers[name] = controller
            self._note(name, "acquired", lease.token)

    def _drop(self, name: str, why: str) -> None:
        with self._lock:
            lease = self.held.pop(name, None)
            self.controllers.pop(name, None)
        if self.metrics is not None:
            self.metrics.forget(name)
        if lease is not None:
            self._note(name, why, lease.token)

    def _drop_all(self, why: str) -> None:
        log.warning("replica %s: %s; stopping all partitions", self.config.name, why)
        for name in list(self.held):
            self._drop(name, "unprovable")

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

    def cycle(self, pool: ThreadPoolExecutor) -> list[CycleReport]:
        names = self.actable()
        with self._lock:
            running = {n: self.controllers[n] for n in names if n in self.controllers}
        futures = {n: pool.submit(c.cycle) for n, c in running.items()}
        reports = []
        for name, future in futures.items():
            try:
                report = future.result()
                reports.append(report)
                if self.metrics is not None:
                    self.metrics.observe(report)
            except FencedOut as e:
                log.warning("replica %s: %s fenced out: %s", self.config.name, name, e)
                self._drop(name, "lost")
            except Exception:
                log.exception("replica %s: partition %s cycle failed", self.config.name, name)
        try:
            self._relay.after_round()
        except Exception as e:
            log.warning("replica %s: signals skipped: %s", self.config.name, type(e).__name__)
        return reports

    def run(
        self,
        stop: threading.Event,
        rounds: int | None = None,
        on_round: Callable[[Sequence[CycleReport]], None] | None = None,
    ) -> int:
        """Cycles every `interval_s` until stopped; the leases are tended meanwhile in
        a thread of their own, so a long cycle (Nova's scheduler can take a minute)
        never lets them lapse."""
        halt = threading.Event()
        tender = threading.Thread(
            target=self._tend_loop, args=(stop, halt), name="sco-leases", daemon=True
        )
        self.tend_leases()
        tender.start()
        done = 0
        try:
            with ThreadPoolExecutor(max_workers=max(len(self.partitions), 1)) as pool:
                while not stop.is_set() and (rounds is None or done < rounds):
                    started = self.clock.now()
                    reports = self.cycle(pool)
                    done += 1
                    if on_round is not None:
                        on_round(reports)
                    if rounds is not None and done >= rounds:
                        break
                    stop.wait(max(0.0, self.interval_s - (self.clock.now() - started)))
        finally:
            halt.set()
            tender.join(timeout=30)
        return done

    def _tend_loop(self, stop: threading.Event, halt: threading.Event) -> None:
        while not (stop.is_set() or halt.is_set()):
            if halt.wait(self.config.lease_every_s):
                return
            try:
                self.tend_leases()
            except Exception:
                log.exception("replica %s: tending leases failed", self.config.name)

    def shutdown(self) -> None:
        """Hand every lease back, so others take over at once rather than after the TTL."""
        for name, lease in list(self.held.items()):
            self._drop(name, "released")
            try:
                self.leases.release(lease)
            except Exception as e:
                log.warning("release of %s failed: %s", name, type(e).__name__)
        try:
            self.leases.forget_replica(self.config.name)
        except Exception as e:
            log.warning("forgetting replica failed: %s", type(e).__name__)
