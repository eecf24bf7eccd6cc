"""Pool signals as the controllers of one process see them.

Recent reclaims per pool (what the controllers saw themselves, within the
last hour), exclusions from the watcher and scores from the scorer.
"""

from __future__ import annotations

from collections import defaultdict, deque

from sco.domain.pools import PoolId
from sco.domain.signals import Exclusion, ExclusionState, PoolScore


class ReclaimMemory:
    def __init__(self, window_s: float = 3600.0) -> None:
        self.window_s = window_s
        self._times: dict[PoolId, deque[float]] = defaultdict(deque)

    def note(self, pool: PoolId, at: float) -> None:
        self._times[pool].append(at)

    def last(self, pool: PoolId) -> float | None:
        times = self._times.get(pool)
        return times[-1] if times else None

    def count(self, pool: PoolId, now: float) -> int:
        times = self._times.get(pool)
        if not times:
            return 0
        while times and times[0] < now - self.window_s:
            times.popleft()
        return len(times)


class PoolSignals:
    """Exclusions and the latest scores as the controllers of one process see them.

    The watcher and the scorer, when they run in the same process, hand each
    change over at once; otherwise `replace` and `set_scores` are fed from
    fleet state.
    """

    def __init__(self) -> None:
        self._exclusions: dict[PoolId, Exclusion] = {}
        self._scores: dict[PoolId, PoolScore] = {}
        self._up: dict[PoolId, float] = {}
        self.episodes = 0  # exclusions and degradations begun
        self.changes = 0  # exclusion changes and new score generations seen

    def capacity_seen(self, pool: PoolId, now: float, has_capacity: bool) -> float | None:
        """Since when `pool` has had capacity, as far as this process has seen (a pool
        first seen counts as fresh: the cautious guess)."""
        if not has_capacity:
            self._up.pop(pool, None)
            return None
        return self._up.setdefault(pool, now)

    def set_scores(self, scores: list[PoolScore]) -> None:
        before = next(iter(self._scores.values())).generation if self._scores else None
        self._scores = {s.pool: s for s in scores}
        if scores and scores[0].generation != before:
            self.changes += 1

    def score(self, pool: PoolId) -> PoolScore | None:
        return self._scores.get(pool)

    def update(self, exclusion: Exclusion) -> None:
        if exclusion.since == exclusion.last_crossing:
            self.episodes += 1
        self.changes += 1
        self._exclusions[exclusion.pool] = exclusion

    def replace(self, exclusions: dict[PoolId, Exclusion]) -> None:
        self._exclusions = dict(exclusions)

    def state(self, pool: PoolId, now: float) -> ExclusionState | None:
        ex = self._exclusions.get(pool)
        return ex.state if ex is not None and ex.active(now) else None
