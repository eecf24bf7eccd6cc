"""Placing replicas over pools: the cheapest allocation under a separable convex cost.

The k-th replica in pool p costs its hazard h_p, plus `crowding` x (k-1) (replicas
that share a pool fall together), less `stickiness` while k is within what the
pool already holds (moving costs a cold start). Marginal costs rise with k, so
taking the cheapest marginals first is optimal (a greedy on a polymatroid); it is
done here without stepping replica by replica: a threshold on the marginal cost
is found by bisection, pool counts follow in closed form, and a heap places the
last few. `bench/planner.py` checks the result against HiGHS on the same cost.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sco.domain.pools import PoolId


class Slot(NamedTuple):  # a tuple: made for every pool at every plan, thousands a second
    pool: PoolId
    hazard: float
    held: int  # replicas there now
    room: int  # the most it may hold after this decision (held + headroom, or held)


def marginal(s: Slot, k: int, crowding: float, stickiness: float) -> float:
    """The cost of the k-th replica (1-based) in slot `s`."""
    return s.hazard + crowding * (k - 1) - (stickiness if k <= s.held else 0.0)


def cost(
    slots: Sequence[Slot], counts: Mapping[PoolId, int], crowding: float, stickiness: float
) -> float:
    total = 0.0
    for s in slots:
        n = counts.get(s.pool, 0)
        total += n * s.hazard + crowding * n * (n - 1) / 2 - stickiness * min(n, s.held)
    return total


def place(
    slots: Sequence[Slot], want: int, crowding: float, stickiness: float
) -> dict[PoolId, int]:
    """Replicas per pool: min(want, total room) of them, at the least total cost."""
    if crowding <= 0:
        raise ValueError(f"crowding must be > 0, got {crowding}")
    want = min(want, sum(max(0, s.room) for s in slots))
    if want <= 0:
        return {}
    if want <= _SMALL:
        return _by_heap(slots, {s.pool: 0 for s in slots}, want, crowding, stickiness)
    lo = min(s.hazard for s in slots) - stickiness - 1.0
    hi = max(s.hazard for s in slots) + crowding * want + 1.0
    # Down to half a crowding step: then each pool lies at most a replica or two
    # above `lo`, and the heap places those.
    while hi - lo > crowding / 2:
        mid = (lo + hi) / 2
        if _below(slots, mid, crowding, stickiness) >= want:
            hi = mid
        else:
            lo = mid
    counts = {s.pool: _count(s, lo, crowding, stickiness) for s in slots}
    return _by_heap(slots, counts, want - sum(counts.values()), crowding, stickiness)


_SMALL = 64  # below this many replicas, the heap alone is quicker than bisection


def _by_heap(
    slots: Sequence[Slot], counts: dict[PoolId, int], left: int, crowding: float, stickiness: float
) -> dict[PoolId, int]:
    """Add `left` replicas to `counts`, the cheapest next marginal each time."""
    heap = [
        (marginal(s, counts[s.pool] + 1, crowding, stickiness), s.pool, i)
        for i, s in enumerate(slots)
        if counts[s.pool] < s.room
    ]
    heapq.heapify(heap)
    while left > 0 and heap:
        _, pool, i = heapq.heappop(heap)
        counts[pool] += 1
        left -= 1
        s = slots[i]
        if counts[pool] < s.room:
            heapq.heappush(heap, (marginal(s, counts[pool] + 1, crowding, stickiness), pool, i))
    return {p: n for p, n in counts.items() if n}


def _below(slots: Sequence[Slot], tau: float, crowding: float, stickiness: float) -> int:
    """sum(_count(s, tau, ...) for s in slots), inlined: the bisection's inner loop."""
    total = 0
    floor = math.floor
    for s in slots:
        room = s.room if s.room > 0 else 0
        kept = s.held if s.held < room else room
        slack = tau - s.hazard + stickiness
        a = floor(slack / crowding + 1e-12) + 1 if slack >= 0 else 0
        if a < kept:
            total += a
            continue
        slack -= stickiness
        b = floor(slack / crowding + 1e-12) + 1 if slack >= 0 else 0
        total += room if b > room else (kept if b < kept else b)
    return total


def _count(s: Slot, tau: float, crowding: float, stickiness: float) -> int:
    """How many of the slot's replicas have marginal cost <= tau (a prefix)."""
    room = max(0, s.room)
    kept = min(s.held, room)
    a = _prefix(tau - s.hazard + stickiness, crowding)
    if a < kept:
        return a
    b = _prefix(tau - s.hazard, crowding)
    return min(room, max(kept, b))


def _prefix(slack: float, crowding: float) -> int:
    """The largest k with crowding x (k-1) <= slack (0 when none)."""
    if slack < 0:
        return 0
    return math.floor(slack / crowding + 1e-12) + 1
