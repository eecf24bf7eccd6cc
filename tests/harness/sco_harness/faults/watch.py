"""What the fault scenarios that run `sco run` watch and audit (slurm, openbao, disk).

`CycleWatch` scrapes one process's /metrics every half second and keeps, per
partition, every completed cycle it saw (when, and whether it was degraded);
the audits read fleet state, the embedded event log and the cloud.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import create_engine, text

from sco_harness.chaos import audit
from sco_harness.controlplane import committed_events

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"]}
SLOTS = 4
_SERIES = re.compile(
    r'^(sco_cycle_seconds_count|sco_partition_degraded)\{partition="([^"]+)"\} (.*)$'
)


@dataclass
class CycleWatch:
    """Every partition's completed cycles, from `metrics()` (Prometheus text) every
    `every_s`: (when, degraded) each time a partition's cycle count went up."""

    metrics: Callable[[], str]
    every_s: float = 0.5
    seen: dict[str, list[tuple[float, bool]]] = field(default_factory=lambda: defaultdict(list))
    _counts: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> CycleWatch:
        threading.Thread(target=self._watch, name="cycle-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.scrape(self.metrics())

    def scrape(self, metrics: str) -> None:
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
            before = self._counts.get(partition)
            self._counts[partition] = n
            if before is None or n > before:
                self.seen[partition].append((now, degraded.get(partition, False)))

    def cycles(self, partition: str, since: float, until: float) -> list[tuple[float, bool]]:
        return [(at, bad) for at, bad in list(self.seen.get(partition, [])) if since <= at < until]

    def first_ok(self, partition: str, after: float) -> float | None:
        """When `partition` first completed a cycle that was not degraded, after `after`."""
        return next(
            (at for at, bad in self.cycles(partition, after, float("inf")) if not bad), None
        )

    def healthy_since(self, partitions: list[str], after: float) -> float | None:
        """When every one of `partitions` had completed an undegraded cycle after `after`."""
        firsts = [self.first_ok(p, after) for p in partitions]
        if any(t is None for t in firsts):
            return None
        return max(t for t in firsts if t is not None)

    def longest_gap_s(self, partition: str, since: float, until: float, ok_only: bool) -> float:
        """The longest stretch of [since, until] without a completed cycle of
        `partition` (`ok_only`: without an undegraded one)."""
        times = [at for at, bad in self.cycles(partition, since, until) if not (ok_only and bad)]
        edges = [since, *times, until]
        return max(b - a for a, b in itertools.pairwise(edges))

    def stalled(
        self, partitions: list[str], since: float, until: float, gap_s: float, ok_only: bool
    ) -> list[str]:
        """Partitions that went more than `gap_s` without a (undegraded, with
        `ok_only`) cycle in [since, until]."""
        return [p for p in partitions if self.longest_gap_s(p, since, until, ok_only) > gap_s]


def counter_sum(metrics: str, name: str, **labels: str) -> float:
    """The sum of every sample of counter `name` whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rpartition(" ")[2])
    return total


def event_log_ids(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return {r[0] for r in c.execute(text("SELECT event_id FROM event_log")).all()}
    finally:
        engine.dispose()


def missing_events(url: str, timeout_s: float) -> set[str]:
    """Committed events (one per recorded transition and exclusion) the embedded event
    log does not hold after up to `timeout_s` (the relay runs in `sco run`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = committed_events(url) - event_log_ids(url)
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(1.0)


def settled_audit(
    url: str, servers: Callable[[], list[dict[str, Any]]], timeout_s: float = 30.0
) -> dict[str, int]:
    """sco_harness.chaos.audit once creates and deletes in flight have landed: a
    server counts as leaked only if it stays without a record."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = audit(url, servers())
        if found["leaked_servers"] == 0 or time.monotonic() > deadline:
            return found
        time.sleep(2.0)


def ready_by_partition(url: str) -> dict[str, int]:
    """READY instances per partition in fleet state (0 before it is migrated)."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT \"partition\", count(*) FROM instances WHERE state = 'ready' GROUP BY 1"
                )
            ).all()
    except (OperationalError, ProgrammingError):
        return {}
    finally:
        engine.dispose()
    return {str(p): int(n) for p, n in rows}


def clear_servers(stack: Any, timeout_s: float = 120.0) -> None:
    """Every server of the stack deleted (between scenarios sharing one stack)."""
    for s in stack.servers():
        stack.conn.compute.delete(f"/servers/{s['id']}", microversion="2.90")
    deadline = time.monotonic() + timeout_s
    while stack.servers():
        if time.monotonic() > deadline:
            raise RuntimeError("servers still there after deleting them all")
        time.sleep(1.0)
