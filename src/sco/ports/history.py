"""Pool history: lifecycle events by pool and time, for scoring (ClickHouse or chDB in
production, a window in memory in the lab)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sco.decide.scorer import PoolStats
from sco.domain.events import LifecycleEvent


class PoolHistory(Protocol):
    def load(self, events: Sequence[LifecycleEvent]) -> int:
        """Keep `events`; an event id already kept counts once however often it is
        loaded (a loader that crashed before committing loads again). Returns how many
        were given."""
        ...

    def pool_stats(self, now: float, window_s: float) -> list[PoolStats]:
        """Each pool's raw counts over [now - window_s, now] (both ends in), by pool
        name: exposure
        of ready instances, reclaims, create attempts and successes, time to ready,
        headroom samples."""
        ...
