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
  with the lowest hazard: a pool's reclaims come together, so two replicas in
  one pool are one failure. Replicas stay where they are (no churn) unless
  their pool is gone or excluded.
- **Hedge.** Extra spot replicas sized to the reclaims expected within one
  cold start (a pool's reclaim takes all its replicas), none when the provider
  gives a notice at least as long as a cold start: the replacement then starts
  at the notice and is ready in time.
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

from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
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


def plan(snapshot: PartitionSnapshot, cfg: HedgeConfig) -> HedgePlan:
    now = snapshot.now
    demand = snapshot.demand
    part = snapshot.partition
    spot_views = sorted(
        (v for v in snapshot.pools.values() if v.pool.is_spot and part.accepts(v.pool.flavor)),
        key=lambda v: v.pool.id,
    )
    held = Counter(i.pool for i in snapshot.instances if i.is_spot and i.is_live)
    own = {v.pool.id: hazard_per_h(v, now, cfg) for v in spot_views}
    storm = cfg.region_reclaim_hazard * sum(v.recent_reclaims for v in spot_views)
    hazard = {p: h + storm for p, h in own.items()}
    usable = [v for v in spot_views if not v.excluded and held[v.pool.id] + v.available > 0]
    targets = _place(demand.wanted_units, spot_views, usable, held, hazard)
    notes: list[str] = []
    spare = _spare(targets, hazard, snapshot, cfg)
    hedge_g = 0
    if spare:
        spread = _place(demand.wanted_units + spare, spot_views, usable, held, hazard)
        # A spare in a pool that already holds replicas falls with them: where spot
        # cannot spread, the spare goes on guaranteed capacity.
        fresh = sum(1 for p, n in spread.items() if n and not targets.get(p))
        spot_spare = min(spare, fresh) if max(targets.values(), default=0) > 1 else spare
        if spot_spare:
            targets = _place(demand.wanted_units + spot_spare, spot_views, usable, held, hazard)
        # A storm elsewhere buys spare spot, not guaranteed capacity.
        hedge_g = min(spare - spot_spare, _spare(targets, own, snapshot, cfg))
        notes.append(f"hedge: {spot_spare} spare spot, {hedge_g} guaranteed")
    guaranteed, gnotes = _floor(snapshot, targets, cfg, hedge_g)
    return HedgePlan({p: n for p, n in targets.items() if n}, guaranteed, tuple(notes + gnotes))


def _place(
    want: int,
    views: list[PoolView],
    usable: list[PoolView],
    held: Counter[PoolId],
    hazard: Mapping[PoolId, float],
) -> dict[PoolId, int]:
    """Keep what is held in usable pools, up to `want`; add one per pool, safest first."""
    ok = {v.pool.id for v in usable}
    keep: dict[PoolId, int] = {v.pool.id: held[v.pool.id] for v in views if v.pool.id in ok}
    total = sum(keep.values())
    # Over: drop from the riskiest pools, the most crowded first.
    while total > want:
        p = max((p for p, n in keep.items() if n), key=lambda p: (keep[p] > 1, hazard[p], p))
        keep[p] -= 1
        total -= 1
    room = {v.pool.id: keep.get(v.pool.id, 0) + v.available for v in usable}
    while total < want:
        open_ = [p for p in keep if keep[p] < room[p]]
        if not open_:
            break
        p = min(open_, key=lambda p: (keep[p], hazard[p], p))
        keep[p] += 1
        total += 1
    return keep


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
    spot_targets: Mapping[PoolId, int],
    cfg: HedgeConfig,
    hedge_units: int = 0,
) -> tuple[dict[PoolId, int], list[str]]:
    now = snapshot.now
    part = snapshot.partition
    g_views = sorted(
        (
            v
            for v in snapshot.pools.values()
            if not v.pool.is_spot and part.accepts(v.pool.flavor) and not v.excluded
        ),
        key=lambda v: (v.price, v.pool.id),
    )
    held_g = Counter(i.pool for i in snapshot.instances if not i.is_spot and i.is_live)
    if not g_views:
        return dict(held_g), ["no guaranteed pool"]
    floor = snapshot.demand.floor_units
    # Noticed spot still serves, but is gone before anything launched now is ready.
    serving = [i for i in snapshot.instances if i.is_spot and i.state is State.READY]
    live_spot = [i for i in snapshot.instances if i.is_spot and i.is_live]
    booting = sum(i.units for i in live_spot if i.state is not State.READY)
    # Spot launched this cycle arrives with any guaranteed launched now.
    coming = booting + max(0, sum(spot_targets.values()) - len(live_spot))
    ready_units = sum(i.units for i in serving)
    gap = max(0, floor - ready_units - coming) + hedge_units
    have = sum(held_g.values())
    notes: list[str] = []
    if gap > have:
        g = g_views[0]
        targets = dict(held_g)
        targets[g.pool.id] = targets.get(g.pool.id, 0) + (gap - have)
        notes.append(f"floor: {gap - have} guaranteed for spot that cannot arrive in time")
        return targets, notes
    stable = sum(
        i.units
        for i in serving
        if i.ready_at is not None and i.ready_at <= now - cfg.release_after_s
    )
    keep = max(gap, min(have, max(0, floor - stable)))
    release = min(have - keep, cfg.max_release_per_cycle)
    targets = dict(held_g)
    for v in reversed(g_views):  # the dearest first
        while release and targets.get(v.pool.id, 0):
            targets[v.pool.id] -= 1
            release -= 1
    return {p: n for p, n in targets.items() if n}, notes
