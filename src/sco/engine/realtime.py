"""The controllers of a process cycled a round at a time, on the wall clock.

`RealtimeRunner.round` cycles every partition once, each on its own thread, and
returns when all are done: a dry run looks once, and tests step the cloud round
by round. A deployment (`sco run`) runs partitions independently in time
(`sco.engine.loops`, `sco.engine.replicas`). Runners are made by
`sco.engine.builder`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from sco.engine.controller import PartitionController
from sco.engine.cycle import CycleReport
from sco.engine.metrics import PlacementMetrics
from sco.engine.signals import FleetSignals
from sco.ports import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundReport:
    at: float
    cycles: tuple[CycleReport, ...]
    provider_degraded: str = ""


class RealtimeRunner:
    """One controller per partition, cycled a round at a time."""

    def __init__(
        self,
        *,
        controllers: Sequence[PartitionController],
        signals: FleetSignals,
        clock: Clock,
        threads: Executor,
        degraded: Callable[[], str] = lambda: "",
        metrics: PlacementMetrics | None = None,
    ) -> None:
        """`threads` runs the partitions' cycles of a round side by side."""
        self.clock = clock
        self.threads = threads
        self.metrics = metrics
        self._degraded = degraded
        self.signals = signals
        self.controllers = list(controllers)

    def round(self) -> RoundReport:
        """One cycle of every partition, at once; returns when all are done."""
        at = self.clock.now()
        reports: list[CycleReport] = []
        futures = [self.threads.submit(c.cycle) for c in self.controllers]
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

    def close(self) -> None:
        self.threads.shutdown(wait=True)


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
