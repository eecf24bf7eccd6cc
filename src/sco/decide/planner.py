"""Portfolio planner, first version: spread the spot target over pools by score.

Scores are normalised to 0..1 and weighted (Nova's weighers). Each instance
goes to the pool with the best marginal value, score / (1 + planned there),
so the target spreads; a bonus for instances already held keeps churn low.
Per-pool and per-hall caps bound what one failure domain can take away.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sco.domain.instances import Instance
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    max_pool_share: float = 0.5  # of the partition's spot instances, in one pool
    max_hall_share: float = 0.67  # of the partition's spot instances, in one hall
    strict_caps: bool = False  # True: leave demand unplaced rather than exceed a cap
    hedge_instances: int = 0  # spot instances beyond the target
    price_weight: float = 1.0
    headroom_weight: float = 1.0
    reclaim_weight: float = 2.0
    stickiness: float = 0.5  # added to a pool's value for each instance already held there
    degraded_factor: float = 0.5  # a degraded pool's score is multiplied by this

    def __post_init__(self) -> None:
        for name in ("max_pool_share", "max_hall_share"):
            share = getattr(self, name)
            if not 0 < share <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {share}")
        if self.hedge_instances < 0:
            raise ValueError(f"hedge_instances must be >= 0, got {self.hedge_instances}")


@dataclass(frozen=True, slots=True)
class PoolRank:
    value: float
    why: str


@dataclass(frozen=True, slots=True)
class SpotPlan:
    targets: Mapping[PoolId, int]
    unplaced_units: int
    notes: tuple[str, ...]


def held_by_pool(instances: Iterable[Instance]) -> Counter[PoolId]:
    """Live instances per pool: what a pool's target is compared against."""
    return Counter(i.pool for i in instances if i.is_live)


def rank_pools(views: Iterable[PoolView], cfg: PlannerConfig) -> dict[PoolId, PoolRank]:
    """Weighted sum of normalised pool qualities: cheap, roomy, rarely reclaimed."""
    views = list(views)
    if not views:
        return {}
    lo = min(v.price for v in views)
    most_room = max(v.available for v in views) or 1
    scores: dict[PoolId, PoolRank] = {}
    for v in views:
        # A ratio, not min-max: a 5 % dearer pool scores 5 % lower, not zero.
        cheap = lo / v.price if v.price > 0 else 1.0
        room = v.available / most_room
        calm, said = _calm(v)
        value = cfg.price_weight * cheap + cfg.headroom_weight * room + cfg.reclaim_weight * calm
        if v.degraded:
            value *= cfg.degraded_factor
        why = f"cheap={cheap:.2f} room={room:.2f} calm={calm:.2f} ({said})"
        if v.degraded:
            why += f" degraded x{cfg.degraded_factor:g}"
        scores[v.pool.id] = PoolRank(value=value, why=why)
    return scores


def _calm(v: PoolView) -> tuple[float, str]:
    """How little the pool takes back: its history's survival x create success once
    scored, damped by what it reclaimed within the hour; until then only the latter."""
    recent = 1.0 / (1.0 + v.recent_reclaims)
    if v.score is None:
        return recent, f"reclaims={v.recent_reclaims}, not scored yet"
    return v.score.value * recent, (
        f"survival={v.score.survival:.2f} success={v.score.success_ratio:.2f} "
        f"reclaims={v.recent_reclaims}"
    )


def spot_need_units(snapshot: PartitionSnapshot, cfg: PlannerConfig, unit: int) -> int:
    demand = snapshot.demand
    return min(demand.wanted_units + cfg.hedge_instances * unit, demand.max_units)


def plan_spot(snapshot: PartitionSnapshot, cfg: PlannerConfig) -> SpotPlan:
    """Spot instance target per pool for `snapshot`'s partition."""
    part = snapshot.partition
    candidates = [
        v for v in snapshot.pools.values() if v.pool.is_spot and part.accepts(v.pool.flavor)
    ]
    if not candidates:
        need = snapshot.demand.wanted_units
        return SpotPlan({}, need, ("no spot pool accepts this partition",) if need else ())
    held = held_by_pool(i for i in snapshot.instances if i.is_spot)
    unit = min(v.pool.units_per_instance for v in candidates)
    need = spot_need_units(snapshot, cfg, unit)
    # An excluded pool keeps what it holds but gets nothing new.
    capacity = {v.pool.id: held[v.pool.id] + (0 if v.excluded else v.available) for v in candidates}
    scores = rank_pools(candidates, cfg)
    views = {v.pool.id: v for v in candidates}
    n_est = max(1, math.ceil(need / unit))
    caps = _Caps(
        pool=max(1, math.ceil(cfg.max_pool_share * n_est)),
        hall=max(1, math.ceil(cfg.max_hall_share * n_est)),
    )
    alloc, placed, relaxed = _fill(need, views, scores, held, capacity, caps, cfg)
    notes: list[str] = []
    excluded = sorted(p for p, v in views.items() if v.excluded)
    if excluded:
        notes.append(f"excluded: {', '.join(excluded)}")
    if relaxed:
        notes.append(f"caps relaxed: pool {caps.pool}, hall {caps.hall} could not place {need}")
    unplaced = max(0, need - placed)
    if unplaced:
        full = sorted(p for p in views if alloc.get(p, 0) >= capacity[p])
        notes.append(f"{unplaced} units unplaced: no headroom left in {', '.join(full)}")
    return SpotPlan({p: n for p, n in alloc.items() if n}, unplaced, tuple(notes))


@dataclass(frozen=True, slots=True)
class _Caps:
    pool: int
    hall: int


def _fill(
    need: int,
    views: Mapping[PoolId, PoolView],
    scores: Mapping[PoolId, PoolRank],
    held: Mapping[PoolId, int],
    capacity: Mapping[PoolId, int],
    caps: _Caps,
    cfg: PlannerConfig,
) -> tuple[dict[PoolId, int], int, bool]:
    """Greedy water-filling with a heap; relaxes the caps once unless strict."""
    alloc: Counter[PoolId] = Counter()
    halls: Counter[str] = Counter()
    placed = 0
    relaxed = False

    def value(p: PoolId) -> float:
        k = alloc[p]
        bonus = cfg.stickiness if k < held.get(p, 0) else 0.0
        return scores[p].value / (1 + k) + bonus

    def heap_of() -> list[tuple[float, PoolId]]:
        h = [(-value(p), p) for p in views if alloc[p] < capacity[p]]
        heapq.heapify(h)
        return h

    heap = heap_of()
    enforce = True
    while placed < need:
        if not heap:
            if enforce and not cfg.strict_caps:
                enforce, relaxed = False, True
                heap = heap_of()
                continue
            break
        _, p = heapq.heappop(heap)
        hall = views[p].pool.hall
        if enforce and (alloc[p] >= caps.pool or halls[hall] >= caps.hall):
            continue  # capped for good in this pass: alloc and halls only grow
        alloc[p] += 1
        halls[hall] += 1
        placed += views[p].pool.units_per_instance
        if alloc[p] < capacity[p]:
            heapq.heappush(heap, (-value(p), p))
    return dict(alloc), placed, relaxed
