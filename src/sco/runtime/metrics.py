"""Prometheus metrics of placement, fed by the controllers' cycle reports.

- `sco_placement_state{partition, state}`: units `placed` (ready toward the
  target), `unplaced` (target not yet ready) and `mismatch` (live units the
  plan does not want where they are);
- `sco_placement_delay_seconds{partition}`: from an instance's request (when
  the plan wanted it) to its node being ready;
- `sco_partition_degraded{partition}`: 1 while a partition cannot act.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Gauge, Histogram

from sco.runtime.controller import CycleReport

DELAY_BUCKETS = (5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1800, 3600)


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.state = Gauge(
            "sco_placement_state",
            "Units of demand by placement state.",
            ["partition", "state"],
            registry=self.registry,
        )
        self.delay = Histogram(
            "sco_placement_delay_seconds",
            "Seconds from an instance's request to its node being ready.",
            ["partition"],
            buckets=DELAY_BUCKETS,
            registry=self.registry,
        )
        self.degraded = Gauge(
            "sco_partition_degraded",
            "1 while the partition cannot observe or act.",
            ["partition"],
            registry=self.registry,
        )

    def observe(self, report: CycleReport) -> None:
        p = report.partition
        self.degraded.labels(p).set(1 if report.degraded else 0)
        if report.placement is not None:
            self.state.labels(p, "placed").set(report.placement.placed)
            self.state.labels(p, "unplaced").set(report.placement.unplaced)
            self.state.labels(p, "mismatch").set(report.placement.mismatch)
        for delay in report.ready_delays_s:
            self.delay.labels(p).observe(delay)

    def forget(self, partition: str) -> None:
        """A partition this replica no longer leads: its series go, the new leader's come."""
        for state in ("placed", "unplaced", "mismatch"):
            with contextlib.suppress(KeyError):
                self.state.remove(partition, state)
        for metric in (self.delay, self.degraded):
            with contextlib.suppress(KeyError):
                metric.remove(partition)
