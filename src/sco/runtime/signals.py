"""Recent reclaims per pool, shared by the controllers of one process.

A first signal for the planner until the pool scorer and exclusion watcher
replace it: how many reclaims each pool had in the last window.
"""

from __future__ import annotations

from collections import defaultdict, deque

from sco.domain.pools import PoolId


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
