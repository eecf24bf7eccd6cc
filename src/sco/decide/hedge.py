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
  excluded pool keeps what it holds and gets nothing new. A partition of
  thousands spreads by the same weights, crowding counted per pool's even
  share (`crowding`): the safest, cheapest pools hold more.
- **At fleet scale** the floor survives losing its largest pool (for floors of
  `pool_loss_floor_units` and more), guaranteed capacity also covers the target
  spot cannot place, and spares, releases and reclaim counts scale with the
  partition (see `HedgeConfig`).
- **Hedge.** Extra spot replicas sized to the reclaims expected within one
  cold start (a pool's reclaim takes all its replicas), none when the provider
  gives a notice at least as long as a cold start: the replacement then starts
  at the notice and is ready in time. While replicas are still booting toward
  the target, one spare races them (a reclaim during a boot costs a cold start
  again).
- **Floor.** The arbiter (`sco.decide.arbiter`) covers the gap between the
  floor and spot that is ready or will be within the cold start: a
  guaranteed instance launched for a gap that a booting spot replica closes
  as soon costs money and buys nothing. It is handed back, a few per cycle
  (the disruption budget), once spot has been ready `release_after_s`.
- **Cold start and notice** come from the pools: what the region file says
  of each pool, else what history measured (the scorer's median time to
  ready), else `cold_start_s`.
- **Gangs.** Work of many units that runs together (a Slurm job of many nodes)
  is lost whole with any of its pools, so its new units go into one pool, chosen
  by the pool's survival over the job's stake and its price (`sco.decide.gangs`);
  the rest of the demand is spread as above.
- **Reasons.** Every pool's terms (each hazard term, price, crowding,
  stickiness) and the partition's (spare, floor) go into the plan, so
  `sco explain` can say why each count is what it is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.gangs import GangPlan, lasts
from sco.decide.placement import Slot, place
from sco.decide.spares import guaranteed_spares, spares
from sco.domain.demand import Demand
from sco.domain.lifecycle import LIVE, State
from sco.domain.plans import PoolReason
from sco.domain.pools import CapacityClass, PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    cold_start_s: float = 120.0  # launch to serving, where no pool says otherwise
    lomax_alpha: float = 1.0  # hazard at age u hours: alpha / (beta + u), per hour
    lomax_beta_h: float = 1.0
    recent_reclaim_hazard: float = 1.0  # per hour, added per reclaim seen within the hour
    full_pool_hazard: float = 1.0  # per hour, added when we hold all of a pool's capacity:
    # then any shrink of the pool takes ours (capacity drops by one or two are common)
    region_reclaim_hazard: float = 1.0  # per hour, added to every pool per reclaim seen
    # anywhere within the hour: reclaims come in storms
    degraded_hazard: float = 5.0  # per hour, added to a pool the watcher marked degraded
    # (it would be excluded, but it is among the last candidates of its flavor)
    spare_risk: float = 0.1  # spares so that the chance that reclaims within one cold start
    # take more replicas than there are spares is at most this (`sco.decide.spares`)
    floor_spare_risk: float = 0.02  # ... and guaranteed ones, where spot cannot spread
    # them and the floor is at stake: the floor is a promise, the target a wish
    max_spare: int = 2  # 0: no spares
    spare_fraction: float = 0.05  # ... or up to this share of the wanted units, when more
    reclaim_count_cap: int = 10  # a pool's reclaims within the hour count up to this many:
    # at fleet scale one reclaim takes hundreds of instances at once, and is one event
    cover_target: bool = True  # guaranteed also covers the target that spot cannot place
    # (no room), not only the floor; what spot is booting toward counts as arriving
    pool_loss_floor_units: int = 50  # a floor this large survives losing its largest spot
    # pools at once (guaranteed covers their share); smaller floors rely on spares
    pool_loss_pools: int = 1  # ... this many of them. In the AWS traces zones drop alone
    # about 32 times a day, two together about 4, more under once; covering two costs
    # much where few pools have room (0.77 against 0.65 of all-guaranteed on the
    # 16-node fleet scenario) for floor availability already over 99.8 % with one
    boot_spare: bool = True  # while spot is short of ready, one spare races the boots
    crowding_per_h: float = 10.0  # the cost of each further replica sharing a pool, while
    # a partition wants no more replicas than it has pools; a larger one spreads its
    # replicas at this cost per pool's even share (see `crowding`)
    price_weight: float = 1.0  # a pool x% dearer than the cheapest weighs x/100 of hazard
    stickiness_per_h: float = 100.0  # a replica stays unless elsewhere is this much safer
    release_after_s: float = 0.0  # spot ready this long before guaranteed goes back
    max_release_per_cycle: int = 3
    release_fraction: float = 0.1  # ... or this share of the guaranteed held, when more
    gang_loss_weight: float = 1.0  # a gang's run thrown away weighs as much as paying
    # for its run again at the cheapest price (`sco.decide.gangs.waste`)
    gang_default_s: float = 3600.0  # a gang's stake when it says no time limit
    gang_requeue_weight: float = 0.25  # ... where the notice saves its work: a reclaim
    # then costs the gang a requeue and a wait, not its stake
    arbiter: ArbiterConfig = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.lomax_alpha <= 0 or self.lomax_beta_h <= 0:
            raise ValueError("lomax_alpha and lomax_beta_h must be > 0")
        for name in ("spare_risk", "floor_spare_risk"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        if self.cold_start_s < 0:
            raise ValueError(f"cold_start_s must be >= 0, got {self.cold_start_s}")
        if not 0 <= self.spare_fraction <= 1:
            raise ValueError(f"spare_fraction must be in [0, 1], got {self.spare_fraction}")
        if self.pool_loss_pools < 0:
            raise ValueError(f"pool_loss_pools must be >= 0, got {self.pool_loss_pools}")
        if self.reclaim_count_cap < 1:
            raise ValueError(f"reclaim_count_cap must be >= 1, got {self.reclaim_count_cap}")
        object.__setattr__(
            self,
            "arbiter",
            ArbiterConfig(self.release_after_s, self.max_release_per_cycle, self.release_fraction),
        )

    def spare_cap(self, wanted_units: int) -> int:
        """Most spares for a partition wanting `wanted_units`: a fleet's reclaims are
        many instances at once, so its spares grow with it."""
        if self.max_spare == 0:
            return 0
        return max(self.max_spare, math.floor(wanted_units * self.spare_fraction))


@dataclass(frozen=True, slots=True)
class HedgePlan:
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...]
    pools: Mapping[PoolId, PoolReason] = field(default_factory=dict)
    terms: Mapping[str, float] = field(default_factory=dict)
    batches: Mapping[PoolId, int] = field(default_factory=dict)  # gangs' creates, whole


def hazard_terms(v: PoolView, now: float, cfg: HedgeConfig) -> dict[str, float]:
    """Expected reclaims per instance-hour in pool `v` now, term by term (they sum to
    the pool's own hazard): its age, its history, its recent reclaims, being full,
    being marked degraded by the watcher."""
    if v.up_since is not None:
        age_h = max(0.0, now - v.up_since) / 3600
        age = cfg.lomax_alpha / (cfg.lomax_beta_h + age_h)
    else:
        age = cfg.lomax_alpha / cfg.lomax_beta_h
    terms = {"age": age}
    if v.score is not None and v.score.exposure_h > 0:
        terms = {"age": age / 2, "history": v.score.hazard_per_h / 2}
    terms["recent_reclaims"] = cfg.recent_reclaim_hazard * min(
        v.recent_reclaims, cfg.reclaim_count_cap
    )
    terms["full_pool"] = cfg.full_pool_hazard if v.available == 0 else 0.0
    terms["degraded"] = cfg.degraded_hazard if v.degraded else 0.0
    return terms


def hazard_per_h(v: PoolView, now: float, cfg: HedgeConfig) -> float:
    """Expected reclaims per instance-hour in pool `v` now."""
    return sum(hazard_terms(v, now, cfg).values())


def cold_start_s(snapshot: PartitionSnapshot, cfg: HedgeConfig) -> float:
    """The slowest cold start among the spot pools that say (configured or measured),
    else the configured default: plan for the replacement that takes longest."""
    known = [v.cold_start_s for v in snapshot.usable(spot=True) if v.cold_start_s is not None]
    return max(known) if known else cfg.cold_start_s


def notice_s(snapshot: PartitionSnapshot) -> float:
    """The reclaim notice every spot pool guarantees (the least of them)."""
    return min((v.notice_s for v in snapshot.usable(spot=True)), default=0.0)


@dataclass(slots=True)
class _Tally:
    """What the plan needs of the instances, read in one pass (partitions are large)."""

    spot_held: Counter[PoolId]  # live spot per pool
    guaranteed_held: Counter[PoolId]
    spot_booting_units: int = 0
    spot_ready_units: int = 0


def _tally(snapshot: PartitionSnapshot) -> _Tally:
    # Comprehensions and Counter's C loop: a partition may hold tens of thousands.
    spot, ready = CapacityClass.SPOT, State.READY
    live = [i for i in snapshot.instances if i.state in LIVE]
    spot_live = [i for i in live if i.capacity_class is spot]
    ready_units = sum(i.units for i in spot_live if i.state is ready)
    return _Tally(
        spot_held=Counter([i.pool for i in spot_live]),
        guaranteed_held=Counter([i.pool for i in live if i.capacity_class is not spot]),
        spot_booting_units=sum(i.units for i in spot_live) - ready_units,
        spot_ready_units=ready_units,
    )


def plan(snapshot: PartitionSnapshot, cfg: HedgeConfig) -> HedgePlan:
    now = snapshot.now
    demand = snapshot.demand
    spot_views = snapshot.usable(spot=True)
    tally = _tally(snapshot)
    held = tally.spot_held
    terms = {v.pool.id: hazard_terms(v, now, cfg) for v in spot_views}
    own = {p: sum(t.values()) for p, t in terms.items()}
    storm = cfg.region_reclaim_hazard * sum(
        min(v.recent_reclaims, cfg.reclaim_count_cap) for v in spot_views
    )
    hazard = {p: h + storm for p, h in own.items()}
    # What asks for guaranteed capacity goes there (the arbiter); spot takes the rest.
    wanted = max(0, demand.wanted_units - demand.guaranteed_units)
    crowd = crowding(wanted, len(spot_views), cfg)
    cold_s, notice = cold_start_s(snapshot, cfg), notice_s(snapshot)
    cheapest = min((v.price for v in spot_views if v.price > 0), default=1.0)
    price = {v.pool.id: _price_term(v, cheapest, cfg) for v in spot_views}
    gangs = _gang_plan(
        snapshot, spot_views, held, hazard, price, cheapest, cfg, crowd, notice >= cold_s
    )
    wanted -= gangs.decide(wanted)  # gangs no pool holds whole: guaranteed takes them
    targets = gangs.place(wanted)
    notes: list[str] = []
    cap = cfg.spare_cap(wanted)
    spare, tail = spares(targets, hazard, cold_s, notice, cfg.spare_risk, cap)
    booting = cfg.boot_spare and tally.spot_ready_units < wanted
    if booting:
        spare = min(cap, max(spare, 1))  # replicas still booting: one more races them
    spare = min(spare, max(0, demand.max_units - demand.wanted_units))  # never past max
    spot_spare = hedge_g = 0
    if spare:
        spread = gangs.place(wanted + spare)
        # A spare in a pool that already holds replicas falls with them: where spot
        # cannot spread, the spare goes on guaranteed capacity.
        fresh = sum(1 for p, n in spread.items() if n and not targets.get(p))
        spot_spare = min(spare, fresh) if max(targets.values(), default=0) > 1 else spare
        if spot_spare == spare:
            targets = spread
        elif spot_spare:
            targets = gangs.place(wanted + spot_spare)
        hedge_g = guaranteed_spares(
            spare - spot_spare, targets, own, cold_s, notice, cap, cfg.floor_spare_risk, demand
        )
        short = tail[spot_spare + hedge_g]  # what the spares held leave to chance
        if spot_spare or hedge_g:
            notes.append(
                f"hedge: {spot_spare} spare spot, {hedge_g} guaranteed (chance reclaims "
                f"within a {cold_s - notice:.0f} s cold start take more: {short:.1%})"
            )
    unit = {v.pool.id: v.pool.units_per_instance for v in spot_views}
    coming = tally.spot_booting_units + sum(
        max(0, n - held[p]) * unit[p] for p, n in targets.items()
    )
    risk = _pool_loss_units(targets, unit, demand, cfg)
    g = arbitrate(
        snapshot,
        cfg.arbiter,
        cover_units=demand.wanted_units if cfg.cover_target else None,
        arriving_units=coming,
        extra_units=hedge_g,
        at_risk_units=risk,
        whole=gangs.whole,
    )
    reasons = _reasons(snapshot, targets, g.targets, tally, terms, storm, price, cfg, crowd)
    plan_terms = {
        "cold_start_s": cold_s,
        "notice_s": notice,
        "storm_per_h": storm,
        "crowding_per_h": crowd,
        "spare": float(spare),
        "spare_shortfall_risk": tail[spot_spare + hedge_g],
        "spare_spot": float(spot_spare),
        "spare_guaranteed": float(hedge_g),
        "boot_spare": 1.0 if booting else 0.0,
        "ready_spot_units": float(tally.spot_ready_units),
        "arriving_spot_units": float(coming),
        "pool_loss_units": float(risk),
        "floor_need_units": float(g.need_units),
        "floor_short_units": float(g.short_units),
    }
    plan_terms.update(gangs.terms())
    notes += gangs.notes()
    spot = {p: n for p, n in targets.items() if n}
    return HedgePlan(spot, g.targets, tuple(notes) + g.notes, reasons, plan_terms, gangs.batches())


def crowding(wanted: int, pools: int, cfg: HedgeConfig) -> float:
    """What each further replica sharing a pool costs. With a few replicas, pools
    fall one by one, so a second replica in a pool costs much; with thousands every
    pool holds hundreds, and a fixed cost per replica would spread them evenly over
    every pool whatever its hazard, price and holdings (moving replicas into each pool
    that comes back, where reclaims are likeliest). So the cost is per even share."""
    share = wanted / pools if pools else 1.0
    return cfg.crowding_per_h / max(1.0, share)


def _spread(
    views: list[PoolView],
    held: Counter[PoolId],
    hazard: Mapping[PoolId, float],
    price: Mapping[PoolId, float],
    cfg: HedgeConfig,
    crowd: float,
) -> Callable[[int, Mapping[PoolId, int] | None], dict[PoolId, int]]:
    """The least-cost spread (`sco.decide.placement`) of so many replicas: an excluded
    pool keeps what it holds but gets nothing new. `keep` (what staying saves) is what
    is held unless said."""
    pools = [(v.pool.id, hazard[v.pool.id] + price[v.pool.id], held[v.pool.id], v) for v in views]
    rooms = [(p, w, n + (0 if v.excluded else v.available)) for p, w, n, v in pools]
    staying = [Slot(p, w, held.get(p, 0), room) for p, w, room in rooms]  # keep: held

    def spread(want: int, keep: Mapping[PoolId, int] | None) -> dict[PoolId, int]:
        slots = staying if keep is None else [Slot(p, w, keep.get(p, 0), r) for p, w, r in rooms]
        return place(slots, want, crowd, cfg.stickiness_per_h)

    return spread


def _gang_plan(
    snapshot: PartitionSnapshot,
    views: list[PoolView],
    held: Counter[PoolId],
    hazard: Mapping[PoolId, float],
    price: Mapping[PoolId, float],
    cheapest: float,
    cfg: HedgeConfig,
    crowd: float,
    noticed: bool,
) -> GangPlan:
    """The spread of `_spread`, with whole jobs in one pool each (`sco.decide.gangs`)."""
    by_id = {v.pool.id: v for v in views}
    now = snapshot.now

    def lasting(pool: PoolId, seconds: float) -> float:
        return survival(by_id[pool], now, seconds, cfg)

    return GangPlan(
        snapshot.demand.gangs,
        held,
        {v.pool.id: 0 if v.excluded else v.available for v in views},
        price,
        _spread(views, held, hazard, price, cfg, crowd),
        lasting,
        cfg.gang_requeue_weight if noticed else cfg.gang_loss_weight,
        cfg.gang_default_s,
        # With a notice that saves the work, a reclaim costs a gang a requeue, not its
        # stake: not worth guaranteed capacity's price.
        None if noticed else _guaranteed_term(snapshot, cheapest, cfg),
    )


def _guaranteed_term(
    snapshot: PartitionSnapshot, cheapest: float, cfg: HedgeConfig
) -> float | None:
    """Guaranteed capacity's price term against the cheapest spot; None: none to take."""
    prices = [v.price for v in snapshot.usable(spot=False) if v.price > 0 and v.available]
    if not prices or snapshot.demand.guaranteed_budget_units <= 0:
        return None
    return cfg.price_weight * (min(prices) / cheapest - 1)


def survival(v: PoolView, now: float, seconds: float, cfg: HedgeConfig) -> float:
    """The chance pool `v` keeps an instance for `seconds` from now (`lasts`)."""
    age_h = max(0.0, now - v.up_since) / 3600 if v.up_since is not None else 0.0
    terms = hazard_terms(v, now, cfg)
    return lasts(terms, age_h, cfg.lomax_alpha, cfg.lomax_beta_h, seconds)


def _price_term(v: PoolView, cheapest: float, cfg: HedgeConfig) -> float:
    return cfg.price_weight * (v.price / cheapest - 1)


def _pool_loss_units(
    targets: Mapping[PoolId, int], unit: Mapping[PoolId, int], demand: Demand, cfg: HedgeConfig
) -> int:
    """Spot units the floor must survive losing at once: the largest pools' share of
    the spread, for floors large enough that a pool is many instances."""
    if demand.floor_units < cfg.pool_loss_floor_units:
        return 0
    shares = sorted((n * unit[p] for p, n in targets.items()), reverse=True)
    return sum(shares[: cfg.pool_loss_pools])


def _reasons(
    snapshot: PartitionSnapshot,
    spot: Mapping[PoolId, int],
    guaranteed: Mapping[PoolId, int],
    tally: _Tally,
    terms: Mapping[PoolId, dict[str, float]],
    storm: float,
    price: Mapping[PoolId, float],
    cfg: HedgeConfig,
    crowd: float,
) -> dict[PoolId, PoolReason]:
    """Per pool, what the planner weighed (per hour) and what it decided."""
    out: dict[PoolId, PoolReason] = {}
    held, stickiness = tally.spot_held, cfg.stickiness_per_h
    for v in snapshot.usable(spot=True):
        p = v.pool.id
        n, have = spot.get(p, 0), held.get(p, 0)
        # What the last replica placed there paid for sharing the pool, and what the
        # replicas already there saved by staying.
        weighed = {
            **terms[p],
            "storm": storm,
            "price": price[p],
            "crowding": crowd * (n - 1 if n > 1 else 0),
            "stickiness": -stickiness * (n if n < have else have),
        }
        out[p] = PoolReason(n, have, v.available, v.price, weighed, _flags(v))
    held = tally.guaranteed_held
    for v in snapshot.usable(spot=False):
        p = v.pool.id
        out[p] = PoolReason(
            guaranteed.get(p, 0), held.get(p, 0), v.available, v.price, {}, _flags(v)
        )
    return out


def _flags(v: PoolView) -> tuple[str, ...]:
    if not (v.excluded or v.undiscovered or v.degraded or v.available == 0):
        return ()  # most pools, most cycles: asked of every pool at every cycle
    return tuple(
        name
        for name, on in (
            ("excluded", v.excluded),
            ("undiscovered", v.undiscovered),
            ("degraded", v.degraded),
            ("no room", v.available == 0),
        )
        if on
    )
