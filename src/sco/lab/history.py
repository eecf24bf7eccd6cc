"""Pool history kept in process, updated event by event.

The scorer runs every 5 minutes; in a simulation that is thousands of runs
over a few weeks of trace, and a chDB scoring query costs about 60 ms on a
week of history. `WindowedHistory` answers `pool_stats` from running sums
instead, with the same meaning as `ClickHouseHistory.pool_stats` (a test
holds the two equal on the same events). It expects what the outbox
delivers: each instance's events in time order, and `now` never going back;
events seen twice (at-least-once delivery) count once, and events after the
`now` asked wait until a later `now` reaches them.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sco.decide.scorer import PoolStats
from sco.domain.events import CREATE_FAILED, CREATE_OK, RECLAIM_KINDS, LifecycleEvent

_LEAVING = frozenset({"noticed", "draining", "terminating", "gone", "failed"})


@dataclass(slots=True)
class _Instance:
    born: float | None = None
    ready: float | None = None
    left: float | None = None


@dataclass(slots=True)
class _Pool:
    instances: dict[str, _Instance] = field(default_factory=dict)
    open: dict[str, float] = field(default_factory=dict)  # ready, not left: instance -> ready
    # Closed (ready, then left) intervals wholly inside the window, by ready time;
    # `closed_s` is their summed length. Older ones move to `edge` as the window slides.
    inside: list[tuple[float, float]] = field(default_factory=list)  # heap of (ready, left)
    closed_s: float = 0.0
    edge: list[tuple[float, float]] = field(default_factory=list)  # (ready, left), ready < lo
    readies: deque[tuple[float, float]] = field(default_factory=deque)  # (ready, ready - born)
    ready_sorted: list[float] = field(default_factory=list)  # the readies' delays, sorted
    reclaims: deque[tuple[float, str]] = field(default_factory=deque)  # (at, instance)
    reclaimed: Counter[str] = field(default_factory=Counter)  # instance -> its reclaims
    gone: deque[tuple[float, str]] = field(default_factory=deque)  # (left, instance)
    attempts: deque[tuple[float, bool]] = field(default_factory=deque)
    successes: int = 0
    headroom: deque[tuple[float, float]] = field(default_factory=deque)
    headroom_sum: float = 0.0


class WindowedHistory:
    """A `PoolHistory` over a fixed window, in memory."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._pools: dict[str, _Pool] = {}
        self._seen: set[str] = set()
        self._seen_order: deque[tuple[float, str]] = deque()
        self._latest = float("-inf")
        # Events after the latest `now` asked (`_asked`), by time: counted once `now`
        # reaches them (the running sums cannot take an event back out).
        self._later: list[tuple[float, int, LifecycleEvent]] = []
        self._order = itertools.count()
        self._asked = float("-inf")

    def load(self, events: Sequence[LifecycleEvent]) -> int:
        for e in events:
            if e.event_id in self._seen or e.at < self._latest - 2 * self.window_s:
                continue  # seen, or too old to be told apart from what was forgotten
            self._seen.add(e.event_id)
            self._seen_order.append((e.at, e.event_id))
            self._latest = max(self._latest, e.at)
            if e.at <= self._asked:
                self._add(self._pools.setdefault(e.pool, _Pool()), e)
            else:
                heapq.heappush(self._later, (e.at, next(self._order), e))
        self._forget_ids()
        return len(events)

    def pool_stats(self, now: float, window_s: float) -> list[PoolStats]:
        if window_s != self.window_s:
            raise ValueError(f"this history keeps {self.window_s}s, asked for {window_s}s")
        self._asked = max(self._asked, now)
        while self._later and self._later[0][0] <= now:
            e = heapq.heappop(self._later)[2]
            self._add(self._pools.setdefault(e.pool, _Pool()), e)
        lo = now - window_s
        out = []
        for name in sorted(self._pools):
            stats = self._stats(name, self._pools[name], lo, now)
            if stats is not None:
                out.append(stats)
        return out

    # ------------------------------------------------------------ loading

    def _add(self, p: _Pool, e: LifecycleEvent) -> None:
        if e.kind in (CREATE_OK, CREATE_FAILED):
            ok = e.kind == CREATE_OK
            p.attempts.append((e.at, ok))
            p.successes += ok
        elif e.kind == "headroom" and e.value is not None:
            p.headroom.append((e.at, e.value))
            p.headroom_sum += e.value
        if not e.instance:
            return
        inst = p.instances.setdefault(e.instance, _Instance())
        if not e.from_state and inst.born is None:
            inst.born = e.at
        if e.to_state == "ready" and inst.ready is None:
            inst.ready = e.at
            if inst.left is None:
                p.open[e.instance] = e.at
            if inst.born is not None:
                p.readies.append((e.at, e.at - inst.born))
                bisect.insort(p.ready_sorted, e.at - inst.born)
        if e.to_state in _LEAVING and inst.left is None:
            inst.left = e.at
            p.gone.append((e.at, e.instance))
            ready = p.open.pop(e.instance, None)
            if ready is not None:
                heapq.heappush(p.inside, (ready, e.at))
                p.closed_s += e.at - ready
        if e.kind in RECLAIM_KINDS:
            p.reclaims.append((e.at, e.instance))
            p.reclaimed[e.instance] += 1

    def _forget_ids(self) -> None:
        # An event older than the window cannot change any answer: its id may go.
        edge = self._latest - 2 * self.window_s
        while self._seen_order and self._seen_order[0][0] < edge:
            self._seen.discard(self._seen_order.popleft()[1])

    # ------------------------------------------------------------ answering

    def _stats(self, name: str, p: _Pool, lo: float, now: float) -> PoolStats | None:
        # Every answer from running sums and kept orders: the scorer asks for every
        # pool every 5 simulated minutes, and a window holds thousands of events.
        _slide(p, lo)
        exposure_s = p.closed_s + sum(left - lo for _, left in p.edge)
        exposure_s += sum(now - max(ready, lo) for ready in p.open.values())
        attempts = len(p.attempts)
        if not (exposure_s or attempts or p.reclaimed or p.ready_sorted or p.headroom):
            return None  # nothing in the window: as no history at all
        return PoolStats(
            pool=name,
            exposure_h=exposure_s / 3600.0,
            reclaims=len(p.reclaimed),
            attempts=attempts,
            successes=p.successes,
            ready_p50_s=_median(p.ready_sorted),
            ready_n=len(p.ready_sorted),
            headroom=p.headroom_sum / len(p.headroom) if p.headroom else None,
            headroom_n=len(p.headroom),
        )


def _median(ordered: list[float]) -> float | None:
    """`statistics.median` of values kept sorted: the middle one, or the mean of two."""
    n = len(ordered)
    if n == 0:
        return None
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _slide(p: _Pool, lo: float) -> None:
    """Move the window's left edge to `lo`: drop what fell out, clip what straddles."""
    while p.inside and p.inside[0][0] < lo:
        ready, left = heapq.heappop(p.inside)
        p.closed_s -= left - ready
        if left > lo:
            p.edge.append((ready, left))
    if p.edge:
        p.edge = [(r, left) for r, left in p.edge if left > lo]
    while p.readies and p.readies[0][0] < lo:
        delay = p.readies.popleft()[1]
        del p.ready_sorted[bisect.bisect_left(p.ready_sorted, delay)]
    while p.reclaims and p.reclaims[0][0] < lo:
        inst = p.reclaims.popleft()[1]
        p.reclaimed[inst] -= 1
        if not p.reclaimed[inst]:
            del p.reclaimed[inst]
    while p.attempts and p.attempts[0][0] < lo:
        p.successes -= p.attempts.popleft()[1]
    while p.headroom and p.headroom[0][0] < lo:
        p.headroom_sum -= p.headroom.popleft()[1]
    if not p.headroom:
        p.headroom_sum = 0.0  # no drift from float subtraction
    _forget_instances(p, lo)


def _forget_instances(p: _Pool, lo: float) -> None:
    # Instances that left before the window answer nothing any more. `gone` is in the
    # order they were told to have left, near enough to time order: one told late
    # goes with the next that is older than the window.
    while p.gone and p.gone[0][0] < lo:
        p.instances.pop(p.gone.popleft()[1], None)
