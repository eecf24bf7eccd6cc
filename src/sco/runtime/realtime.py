"""Running the controllers against a real provider, on the wall clock.

Each round runs every partition's cycle at once, one thread per partition, so
a slow create in one partition (Nova's scheduler takes seconds) never holds
up another. Between rounds the outbox is relayed into the event log and the
exclusion watcher reads it, as in the simulation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import Policy
from sco.domain.demand import Partition
from sco.domain.pools import Pool
from sco.domain.signals import Exclusion
from sco.ports import Clock, DemandSource, Provider, SchedulerCluster
from sco.runtime.clock import IdSource, UuidIds
from sco.runtime.controller import ControllerConfig, CycleReport, PartitionController
from sco.runtime.metrics import PlacementMetrics
from sco.runtime.signals import PoolSignals, ReclaimMemory
from sco.runtime.watcher import ExclusionWatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundReport:
    at: float
    cycles: tuple[CycleReport, ...]
    provider_degraded: str = ""


@dataclass
class ControllerKit:
    """What every partition controller of one process shares; `controller` makes a
    fresh one (it loads the partition's records and adopts servers on its first
    cycle)."""

    provider: Provider
    nodes: SchedulerCluster
    store: SqlFleetStore
    demand: DemandSource
    policy: Callable[[], Policy]
    clock: Clock
    config: ControllerConfig | None = None
    signals: PoolSignals = field(default_factory=PoolSignals)
    reclaims: ReclaimMemory = field(default_factory=ReclaimMemory)
    ids: IdSource = field(default_factory=UuidIds)

    def controller(self, partition: Partition) -> PartitionController:
        return PartitionController(
            partition,
            provider=self.provider,
            nodes=self.nodes,
            store=self.store,
            demand=self.demand,
            policy=self.policy(),
            clock=self.clock,
            ids=self.ids,
            config=self.config,
            reclaims=self.reclaims,
            signals=self.signals,
        )


class SignalRelay:
    """Between rounds: the outbox into the event log, then the exclusion watcher."""

    def __init__(
        self,
        store: SqlFleetStore,
        pools: Sequence[Pool],
        on_change: Callable[[Exclusion], None],
    ) -> None:
        self.events = SqlEventLog(store.engine)
        self.watcher = ExclusionWatcher(self.events, store, list(pools), on_change=on_change)

    def after_round(self) -> None:
        if self.events.absorb_outbox():
            self.watcher.poll(limit=100_000)


class RealtimeRunner:
    """Controllers for every partition of `demand`, cycled every `interval_s`."""

    def __init__(
        self,
        *,
        provider: Provider,
        nodes: SchedulerCluster,
        store: SqlFleetStore,
        demand: DemandSource,
        policy: Callable[[], Policy],
        clock: Clock,
        interval_s: float,
        config: ControllerConfig | None = None,
        degraded: Callable[[], str] = lambda: "",
        relay_events: bool = True,
        metrics: PlacementMetrics | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be > 0, got {interval_s}")
        self.clock = clock
        self.interval_s = interval_s
        self.store = store
        self.metrics = metrics
        self._degraded = degraded
        pools = list(provider.pools())
        store.upsert_pools(pools)
        kit = ControllerKit(provider, nodes, store, demand, policy, clock, config)
        self.signals = kit.signals
        self.controllers = [kit.controller(p) for p in demand.partitions()]
        self._relay = SignalRelay(store, pools, self._excluded) if relay_events else None
        self._pool = ThreadPoolExecutor(
            max_workers=max(len(self.controllers), 1), thread_name_prefix="sco-partition"
        )

    def _excluded(self, exclusion: Exclusion) -> None:
        self.signals.update(exclusion)
        log.info("pool %s: %s (%s)", exclusion.pool, exclusion.state, exclusion.reason)

    def round(self) -> RoundReport:
        """One cycle of every partition, then the signal jobs."""
        at = self.clock.now()
        futures = [self._pool.submit(c.cycle) for c in self.controllers]
        reports: list[CycleReport] = []
        for controller, future in zip(self.controllers, futures, strict=True):
            try:
                report = future.result()
            except Exception:
                # A bug in one partition's cycle must not stop the others.
                log.exception("partition %s: cycle failed", controller.partition.name)
                continue
            reports.append(report)
            if self.metrics is not None:
                self.metrics.observe(report)
        if self._relay is not None:
            self._relay.after_round()
        return RoundReport(at, tuple(reports), self._degraded())

    def run(
        self,
        stop: threading.Event,
        rounds: int | None = None,
        on_round: Callable[[RoundReport], None] | None = None,
    ) -> int:
        """Round after round until `stop` is set or `rounds` are done; returns rounds run."""
        done = 0
        try:
            while not stop.is_set() and (rounds is None or done < rounds):
                started = self.clock.now()
                report = self.round()
                done += 1
                if on_round is not None:
                    on_round(report)
                if rounds is not None and done >= rounds:
                    break
                stop.wait(max(0.0, self.interval_s - (self.clock.now() - started)))
        finally:
            self._pool.shutdown(wait=True)
        return done


def summary(report: RoundReport) -> Sequence[str]:
    """One line per partition for the operator's log."""
    lines = []
    for c in report.cycles:
        status = f"degraded: {c.degraded}" if c.degraded else "ok"
        lines.append(
            f"{c.partition}: plan {c.plan_generation}, +{c.created} created, "
            f"{c.drained} drained, {c.deleted} deleted, {c.transitions} transitions, {status}"
            + (f"; why: {'; '.join(c.notes)}" if c.notes else "")
        )
    if report.provider_degraded:
        lines.append(f"provider degraded: {report.provider_degraded}")
    return lines
