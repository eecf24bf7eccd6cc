"""The hedging planner and floor keeper of the `sco` policy.

What a reclaim costs is the time until a replacement serves (a cold start),
so the plan is about the next cold start:

- **Hazard per pool.** Spot capacity that has just come back goes away again
  soon, and capacity that has lasted tends to last (in the AWS and GCP traces
  the chance a zone's run ends within the hour falls from about 0.5 when fresh
  to about 0.1 after ten hours). The hazard is a Lomax curve in the pool's age
  (`up_since`), raised by reclaims seen within the hour, and, once the scorer
  has history, averaged with the pool's scored hazard.
- **Placement.** Spot replicas go one per pool while pools last, to the pools
  with the lowest hazard (and price: a pool 5 % dearer weighs like 0.05
  reclaims per hour more): a pool's reclaims come together, so two replicas in
  one pool are one failure. Replicas stay where they are (no churn); an
  excluded pool keeps what it holds and gets nothing new.
- **Hedge.** Extra spot replicas sized to the reclaims expected within one
  cold start (a pool's reclaim takes all its replicas), none when the provider
  gives a notice at least as long as a cold start: the replacement then starts
  at the notice and is ready in time. While replicas are still booting toward
  the target, one spare races them (a reclaim during a boot costs a cold start
  again).
- **Floor.** Guaranteed capacity covers the gap between the floor and spot
  that is ready or will be within the cold start: a guaranteed instance
  launched for a gap that a booting spot replica closes as soon costs money
  and buys nothing. It is handed back, a few per cycle (the disruption
  budget), once spot has been ready `release_after_s`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sco.decide.placement import Slot, place
from sco.domain.lifecycle import LIVE, State
from sco.domain.pools import CapacityClass, PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    cold_start_s: float = 120.0  # launch to serving, as the provider's pools behave
    lomax_alpha: float = 1.0  # hazard at age u hours: alpha / (beta + u), per hour
    lomax_beta_h: float = 1.0
    recent_reclaim_hazard: float = 1.0  # per hour, added per reclaim seen within the hour
    full_pool_hazard: float = 1.0  # per hour, added when we hold all of a pool's capacity:
    # then any shrink of the pool takes ours (capacity drops by one or two are common)
    region_reclaim_hazard: float = 1.0  # per hour, added to every pool per reclaim seen
    # anywhere within the hour: reclaims come in storms
    spare_threshold: float = 0.05  # a spare per this many expected reclaims in a cold start
    max_spare: int = 2
    boot_spare: bool = True  # while spot is short of ready, one spare races the boots
    crowding_per_h: float = 10.0  # the cost of each further replica sharing a pool
    price_weight: float = 1.0  # a pool x% dearer than the cheapest weighs x/100 of hazard
    stickiness_per_h: float = 100.0  # a replica stays unless elsewhere is this much safer
    release_after_s: float = 0.0  # spot ready this long before guaranteed goes back
    max_release_per_cycle: int = 3

    def __post_init__(self) -> None:
        if self.lomax_alpha <= 0 or self.lomax_beta_h <= 0:
            raise ValueError("lomax_alpha and lomax_beta_h must be > 0")
        if self.spare_threshold <= 0:
            raise ValueError(f"spare_threshold must be > 0, got {self.spare_threshold}")


@dataclass(frozen=True, slots=True)
class HedgePlan:
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...]


def hazard_per_h(v: PoolView, now: float, cfg: HedgeConfig) -> float:
    """Expected reclaims per instance-hour in pool `v` now."""
    if v.up_since is not None:
        age_h = max(0.0, now - v.up_since) / 3600
        h = cfg.lomax_alpha / (cfg.lomax_beta_h + age_h)
    else:
        h = cfg.lomax_alpha / cfg.lomax_beta_h
    if v.score is not None and v.score.exposure_h > 0:
        h = (h + v.score.hazard_per_h) / 2
    h += cfg.recent_reclaim_hazard * v.recent_reclaims
    return h + (cfg.full_pool_hazard if v.available == 0 else 0.0)


@dataclass(slots=True)
class _Tally:
    """What the plan needs of the instances, read in one pass (partitions are large)."""

    spot_held: Counter[PoolId]  # live spot per pool
    guaranteed_held: Counter[PoolId]
    spot_live: int = 0
    spot_booting_units: int = 0
    spot_ready_units: int = 0
    ready_at: list[float] | None = None  # of ready spot


def _tally(snapshot: PartitionSnapshot) -> _Tally:
    # Comprehensions and Counter's C loop: a partition may hold tens of thousands.
    spot, ready, now = CapacityClass.SPOT, State.READY, snapshot.now
    live = [i for i in snapshot.instances if i.state in LIVE]
    spot_live = [i for i in live if i.capacity_class is spot]
    ready_spot = [i for i in spot_live if i.state is ready]
    ready_units = sum(i.units for i in ready_spot)
    return _Tally(
        spot_held=Counter([i.pool for i in spot_live]),
        guaranteed_held=Counter([i.pool for i in live if i.capacity_class is not spot]),
        spot_live=len(spot_live),
        spot_booting_units=sum(i.units for i in spot_live) - ready_units,
        spot_ready_units=ready_units,
        ready_at=[now if i.ready_at is None else i.ready_at for i in ready_spot],
    )


def plan(snapshot: PartitionSnapshot, cfg: HedgeConfig) -> HedgePlan:
    now = snapshot.now
    demand = snapshot.demand
    spot_views = snapshot.usable(spot=True)
    tally = _tally(snapshot)
    held = tally.spot_held
    own = {v.pool.id: hazard_per_h(v, now, cfg) for v in spot_views}
    storm = cfg.region_reclaim_hazard * sum(v.recent_reclaims for v in spot_views)
    hazard = {p: h + storm for p, h in own.items()}
    targets = _place(demand.wanted_units, spot_views, held, hazard, cfg)
    notes: list[str] = []
    spare = _spare(targets, hazard, snapshot, cfg)
    if cfg.boot_spare and tally.spot_ready_units < demand.wanted_units:
        spare = min(cfg.max_spare, max(spare, 1))  # replicas still booting: one more races them
    spare = min(spare, max(0, demand.max_units - demand.wanted_units))  # never past max
    hedge_g = 0
    if spare:
        spread = _place(demand.wanted_units + spare, spot_views, held, hazard, cfg)
        # A spare in a pool that already holds replicas falls with them: where spot
        # cannot spread, the spare goes on guaranteed capacity.
        fresh = sum(1 for p, n in spread.items() if n and not targets.get(p))
        spot_spare = min(spare, fresh) if max(targets.values(), default=0) > 1 else spare
        if spot_spare == spare:
            targets = spread
        elif spot_spare:
            targets = _place(demand.wanted_units + spot_spare, spot_views, held, hazard, cfg)
        # A storm elsewhere buys spare spot, not guaranteed capacity.
        hedge_g = min(spare - spot_spare, _spare(targets, own, snapshot, cfg))
        notes.append(f"hedge: {spot_spare} spare spot, {hedge_g} guaranteed")
    guaranteed, gnotes = _floor(snapshot, tally, targets, cfg, hedge_g)
    return HedgePlan({p: n for p, n in targets.items() if n}, guaranteed, tuple(notes + gnotes))


def _place(
    want: int,
    views: list[PoolView],
    held: Counter[PoolId],
    hazard: Mapping[PoolId, float],
    cfg: HedgeConfig,
) -> dict[PoolId, int]:
    """The least-cost spread (`sco.decide.placement`): an excluded pool keeps what it
    holds but gets nothing new."""
    cheapest = min((v.price for v in views if v.price > 0), default=1.0)
    slots = [
        Slot(
            v.pool.id,
            hazard[v.pool.id] + cfg.price_weight * (v.price / cheapest - 1),
            held[v.pool.id],
            held[v.pool.id] + (0 if v.excluded else v.available),
        )
        for v in views
    ]
    return place(slots, want, cfg.crowding_per_h, cfg.stickiness_per_h)


def _spare(
    targets: Mapping[PoolId, int],
    hazard: Mapping[PoolId, float],
    snapshot: PartitionSnapshot,
    cfg: HedgeConfig,
) -> int:
    """Spare replicas for the reclaims expected within one cold start."""
    notice = min((v.notice_s for v in snapshot.pools.values() if v.pool.is_spot), default=0.0)
    if notice >= cfg.cold_start_s:
        return 0  # replacements start at the notice and serve in time
    window_h = (cfg.cold_start_s - notice) / 3600
    # A pool's reclaim takes all it holds: expected replicas lost = sum n_p * P(pool drops).
    expected = sum(n * (1 - math.exp(-hazard[p] * window_h)) for p, n in targets.items() if n)
    return min(cfg.max_spare, math.floor(expected / cfg.spare_threshold))


def _floor(
    snapshot: PartitionSnapshot,
    tally: _Tally,
    spot_targets: Mapping[PoolId, int],
    cfg: HedgeConfig,
    hedge_units: int = 0,
) -> tuple[dict[PoolId, int], list[str]]:
    now = snapshot.now
    g_views = sorted(
        (v for v in snapshot.usable(spot=False) if not v.excluded),
        key=lambda v: (v.price, v.pool.id),
    )
    held_g = tally.guaranteed_held
    if not g_views:
        return dict(held_g), ["no guaranteed pool"]
    floor = snapshot.demand.floor_units
    # Noticed spot still serves, but is gone before anything launched now is ready:
    # only READY spot counts. Spot launched this cycle arrives with guaranteed launched now.
    coming = tally.spot_booting_units + max(0, sum(spot_targets.values()) - tally.spot_live)
    gap = max(0, floor - tally.spot_ready_units - coming) + hedge_units
    have = sum(held_g.values())
    notes: list[str] = []
    if gap > have:
        g = g_views[0]
        targets = dict(held_g)
        targets[g.pool.id] = targets.get(g.pool.id, 0) + (gap - have)
        notes.append(f"floor: {gap - have} guaranteed for spot that cannot arrive in time")
        return targets, notes
    settled = now - cfg.release_after_s
    stable = sum(1 for t in tally.ready_at or () if t <= settled)
    keep = max(gap, min(have, max(0, floor - stable)))
    release = min(have - keep, cfg.max_release_per_cycle)
    targets = dict(held_g)
    for v in reversed(g_views):  # the dearest first
        while release and targets.get(v.pool.id, 0):
            targets[v.pool.id] -= 1
            release -= 1
    return {p: n for p, n in targets.items() if n}, notes
