"""The controllers against a real provider, on the wall clock: what every runner shares.

`ControllerKit` builds a partition's controller from what the controllers of
one process share (provider, node plane, fleet state, demand, the fleet's
signals). `RealtimeRunner.round` cycles every partition once, each on its own
thread, and returns when all are done: a dry run looks once, and tests step
the cloud round by round. A deployment (`sco run`) runs partitions
independently in time (`sco.engine.loops`, `sco.engine.replicas`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from sco.decide.policies import Policy
from sco.domain.demand import Partition
from sco.engine.calls import INLINE
from sco.engine.clock import IdSource, UuidIds
from sco.engine.controller import ControllerConfig, CycleReport, PartitionController
from sco.engine.metrics import PlacementMetrics
from sco.engine.signals import FleetSignals
from sco.engine.tokens import TokenIssuer
from sco.ports import Clock, DemandSource, FleetStore, Provider, SchedulerCluster

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
    store: FleetStore
    demand: DemandSource
    policy: Callable[[], Policy]
    clock: Clock
    config: ControllerConfig | None = None
    ids: IdSource = field(default_factory=UuidIds)
    signals_refresh_s: float = 0.5
    tokens: Mapping[str, TokenIssuer] = field(default_factory=dict)  # partitions with agents
    # The signals the controllers share: default, a reader of the store's; a simulation
    # passes its own, refreshed on its clock.
    shared_signals: FleetSignals | None = None
    # Where the controllers' creates and deletes run: at once, on the cycle's thread,
    # unless a deployment gives its workers (sco.engine.calls).
    calls: Executor = INLINE
    signals: FleetSignals = field(init=False)

    def __post_init__(self) -> None:
        self.signals = self.shared_signals or FleetSignals(
            self.store, self.provider.pools(), refresh_s=self.signals_refresh_s
        )

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
            signals=self.signals,
            config=self.config,
            tokens=self.tokens.get(partition.name),
            calls=self.calls,
        )


class RealtimeRunner:
    """One controller per partition of `demand`, cycled a round at a time."""

    def __init__(
        self,
        *,
        provider: Provider,
        nodes: SchedulerCluster,
        store: FleetStore,
        demand: DemandSource,
        policy: Callable[[], Policy],
        clock: Clock,
        config: ControllerConfig | None = None,
        degraded: Callable[[], str] = lambda: "",
        metrics: PlacementMetrics | None = None,
        tokens: Mapping[str, TokenIssuer] | None = None,
    ) -> None:
        self.clock = clock
        self.store = store
        self.metrics = metrics
        self._degraded = degraded
        store.upsert_pools(list(provider.pools()))
        kit = ControllerKit(
            provider, nodes, store, demand, policy, clock, config, tokens=dict(tokens or {})
        )
        self.signals = kit.signals
        self.controllers = [kit.controller(p) for p in demand.partitions()]

    def round(self) -> RoundReport:
        """One cycle of every partition, at once; returns when all are done."""
        at = self.clock.now()
        reports: list[CycleReport] = []
        with ThreadPoolExecutor(max_workers=max(len(self.controllers), 1)) as pool:
            futures = [pool.submit(c.cycle) for c in self.controllers]
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
        return RoundReport(at, tuple(reports), self._degraded())


def summary(report: RoundReport) -> Sequence[str]:
    """One line per partition for the operator's log."""
    return [line(c) for c in report.cycles] + (
        [f"provider degraded: {report.provider_degraded}"] if report.provider_degraded else []
    )


def line(c: CycleReport) -> str:
    """One cycle, for the operator's log."""
    status = f"degraded: {c.degraded}" if c.degraded else "ok"
    return (
        f"{c.partition}: plan {c.plan_generation}, +{c.created} created, "
        f"{c.drained} drained, {c.deleted} deleted, {c.transitions} transitions, {status}"
        + (f"; why: {'; '.join(c.notes)}" if c.notes else "")
    )
