"""How many spares a partition holds beyond what it wants, from the reclaims its pools
may bring within one cold start (`sco.decide.hedge` plans with them).

A spare serves while a reclaimed replica's replacement boots. How many: enough that
the reclaims within one cold start take more replicas than there are spares with a
chance of at most the policy's `spare_risk`, from the whole distribution of what they
may take (each pool's reclaim takes all it holds), not from its mean: the same mean is
little risk spread over pools and much in one. Measured on the SkyServe setting without
notice (`sco evaluate --suite spothedge`, docs/evaluation.md), this rule (a risk of 0.1
for the target's spares, anywhere in 0.1 to 0.2 alike; 0.02 for the floor's guaranteed
ones, anywhere in 0.01 to 0.05) holds as much availability as SpotHedge at under 0.9 of
its cost on four of six traces; a spare per 0.05 expected losses (the rule before) did
on one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sco.domain.demand import Demand
from sco.domain.pools import PoolId


def _drops(hazard_per_h: float, window_h: float) -> float:
    """The chance a pool of this hazard has a reclaim within the window."""
    return -math.expm1(-hazard_per_h * window_h)


def _expected_loss(
    targets: Mapping[PoolId, int], hazard: Mapping[PoolId, float], cold_s: float, notice: float
) -> float:
    """Replicas expected lost within one cold start that no notice covers."""
    if notice >= cold_s:
        return 0.0  # replacements start at the notice and serve in time
    window_h = (cold_s - notice) / 3600
    # A pool's reclaim takes all it holds: expected replicas lost = sum n_p * P(pool drops).
    return sum(n * _drops(hazard[p], window_h) for p, n in targets.items() if n)


def loss_tail(
    targets: Mapping[PoolId, int],
    hazard: Mapping[PoolId, float],
    window_s: float,
    most: int,
) -> list[float]:
    """P(L > s) for s = 0..most, L the replicas reclaims take within `window_s`: each
    pool's reclaim takes all it holds, pools independently (a pool's chance from its
    hazard over the window). The whole distribution, not only its mean: three replicas
    in three pools rarely lose two at once; three in one pool lose all three together."""
    window_h = max(0.0, window_s) / 3600
    exactly = [1.0] + [0.0] * most  # P(L = k); what goes past `most` is dropped
    for p, n in targets.items():
        if n <= 0:
            continue
        q = _drops(hazard[p], window_h)
        if q <= 0:
            continue
        kept = [x * (1 - q) for x in exactly]
        for k in range(most + 1 - n):
            kept[k + n] += exactly[k] * q
        exactly = kept
    tail, below = [], 0.0
    for x in exactly:
        below += x
        tail.append(max(0.0, 1.0 - below))
    return tail


def spares(
    targets: Mapping[PoolId, int],
    hazard: Mapping[PoolId, float],
    cold_s: float,
    notice: float,
    risk: float,
    cap: int,
) -> tuple[int, list[float]]:
    """Spare replicas (at most `cap`) so that the reclaims within one cold start no
    notice covers take more than them with a chance of at most `risk`; and that chance
    for 0..cap spares (`loss_tail`), to say what the spares held leave."""
    if notice >= cold_s:
        return 0, [0.0] * (cap + 1)  # replacements start at the notice, serve in time
    tail = loss_tail(targets, hazard, cold_s - notice, cap)
    return next((s for s, p in enumerate(tail) if p <= risk), cap), tail


def guaranteed_spares(
    unplaced: int,
    targets: Mapping[PoolId, int],
    own: Mapping[PoolId, float],
    cold_s: float,
    notice: float,
    cap: int,
    risk: float,
    demand: Demand,
) -> int:
    """Of the spares spot cannot spread, those worth guaranteed capacity: only when the
    pools' own hazard (not a storm elsewhere, not boots to race) puts the floor itself
    at stake, i.e. the replicas expected lost within a cold start exceed the margin
    between what is wanted and the floor. With a margin, a reclaim costs target, not
    floor, and spot alone is replaced: guaranteed capacity bought for it would be
    created and drained again while nothing else changed. `risk`: the floor's, stricter
    than the target's."""
    if unplaced <= 0:
        return 0
    expected = _expected_loss(targets, own, cold_s, notice)
    if expected <= demand.wanted_units - demand.floor_units:
        return 0
    return min(unplaced, spares(targets, own, cold_s, notice, risk, cap)[0])
