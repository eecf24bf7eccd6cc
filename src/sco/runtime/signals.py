"""Recent reclaims per pool, shared by the controllers of one process.

A first signal for the planner until the pool scorer and exclusion watcher
replace it: how many reclaims each pool had in the last window.
"""

from __future__ import annotations

from collections import defaultdict, deque

from sco.domain.pools import PoolId
from sco.domain.signals import Exclusion, ExclusionState


class ReclaimMemory:
    def __init__(self, window_s: float = 3600.0) -> None:
        self.window_s = window_s
        self._times: dict[PoolId, deque[float]] = defaultdict(deque)

    def note(self, pool: PoolId, at: float) -> None:
        self._times[pool].append(at)

    def count(self, pool: PoolId, now: float) -> int:
        times = self._times.get(pool)
        if not times:
            return 0
        while times and times[0] < now - self.window_s:
            times.popleft()
        return len(times)


class PoolSignals:
    """Exclusions as the controllers of one process see them.

    The watcher, when it runs in the same process, hands each change over at
    once; otherwise `replace` is fed from fleet state.
    """

    def __init__(self) -> None:
        self._exclusions: dict[PoolId, Exclusion] = {}
        self.episodes = 0  # exclusions and degradations begun

    def update(self, exclusion: Exclusion) -> None:
        if exclusion.since == exclusion.last_crossing:
            self.episodes += 1
        self._exclusions[exclusion.pool] = exclusion

    def replace(self, exclusions: dict[PoolId, Exclusion]) -> None:
        self._exclusions = dict(exclusions)

    def state(self, pool: PoolId, now: float) -> ExclusionState | None:
        ex = self._exclusions.get(pool)
        return ex.state if ex is not None and ex.active(now) else None
