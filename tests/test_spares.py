"""Spares from the whole distribution of what reclaims may take within a cold start
(`sco.decide.spares`)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sco.decide.spares import guaranteed_spares, loss_tail, spares
from sco.domain.demand import Demand
from sco.domain.pools import PoolId

HOUR = 3600.0


def _brute_tail(targets: dict[PoolId, int], hazard: dict[PoolId, float], window_s: float,
                most: int) -> list[float]:  # fmt: skip
    """P(L > s) by every subset of pools that could drop."""
    pools = [p for p, n in targets.items() if n]
    q = {p: 1 - math.exp(-hazard[p] * window_s / HOUR) for p in pools}
    exactly = [0.0] * (most + 1)
    for dropped in itertools.product((False, True), repeat=len(pools)):
        chance = math.prod(q[p] if d else 1 - q[p] for p, d in zip(pools, dropped, strict=True))
        lost = sum(targets[p] for p, d in zip(pools, dropped, strict=True) if d)
        if lost <= most:
            exactly[lost] += chance
    return [max(0.0, 1 - sum(exactly[: s + 1])) for s in range(most + 1)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(0.0, 20.0)), min_size=0, max_size=6),
    st.floats(0.0, 1800.0),
    st.integers(0, 8),
)
def test_the_tail_is_the_exact_distribution_of_whole_pools_lost(
    pools: list[tuple[int, float]], window_s: float, most: int
) -> None:
    targets = {PoolId(f"p{k}"): n for k, (n, _) in enumerate(pools)}
    hazard = {PoolId(f"p{k}"): h for k, (_, h) in enumerate(pools)}
    got = loss_tail(targets, hazard, window_s, most)
    want = _brute_tail(targets, hazard, window_s, most)
    assert len(got) == most + 1
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, want, strict=True))
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(got))  # a tail only falls


def test_the_same_mean_loss_spread_or_in_one_pool_asks_for_different_spares() -> None:
    """Three replicas: spread over three pools they rarely go two at once; in one pool
    they go together. The mean loss is the same, the spares are not."""
    h = 1.0  # a reclaim an hour per pool; a 120 s cold start
    spread = {PoolId("a"): 1, PoolId("b"): 1, PoolId("c"): 1}
    hazard = dict.fromkeys(spread, h * 2)
    n, tail = spares(spread, hazard, 120.0, 0.0, 0.1, 5)
    risk = tail[n]
    assert n == 1  # one reclaim (~0.18) is over the risk; two at once (~0.012) is not
    assert risk < 0.02
    packed = {PoolId("a"): 3}
    n, tail = spares(packed, {PoolId("a"): h * 6}, 120.0, 0.0, 0.1, 5)
    risk = tail[n]
    assert n == 3  # the pool's one reclaim takes all three
    assert risk == 0.0


def test_a_notice_that_covers_the_cold_start_needs_no_spare_and_the_cap_holds() -> None:
    targets, hazard = {PoolId("a"): 2}, {PoolId("a"): 50.0}
    assert spares(targets, hazard, 120.0, 120.0, 0.1, 5) == (0, [0.0] * 6)
    n, tail = spares(targets, hazard, 120.0, 0.0, 0.001, 1)
    assert n == 1  # capped: the shortfall it leaves is said
    assert tail[n] > 0.5


def test_guaranteed_spares_only_when_the_floor_is_at_stake() -> None:
    targets = {PoolId("a"): 2, PoolId("b"): 1}
    hazard = dict.fromkeys(targets, 3.0)
    margin = Demand(target_units=3, floor_units=1, max_units=6, guaranteed_budget_units=6)
    assert guaranteed_spares(2, targets, hazard, 120.0, 0.0, 3, 0.02, margin) == 0
    tight = Demand(target_units=3, floor_units=3, max_units=6, guaranteed_budget_units=6)
    assert guaranteed_spares(2, targets, hazard, 120.0, 0.0, 3, 0.02, tight) == 2
    assert guaranteed_spares(0, targets, hazard, 120.0, 0.0, 3, 0.02, tight) == 0
