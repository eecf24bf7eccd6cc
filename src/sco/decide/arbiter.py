"""The fallback arbiter: the one floor keeper every policy uses.

A partition's floor is a promise: that many units run, on any capacity class.
Spot keeps it when spot is there; the arbiter adds guaranteed capacity for
the gap and gives it back when spot has held long enough. The rule:

- **What counts.** Only READY spot counts toward the floor (a booting or
  noticed instance may never arrive, or is leaving), plus `arriving_units`
  the caller vouches for (spot that will be ready as soon as anything
  launched now: the hedge planner counts spot already booting). Units the
  demand says only guaranteed capacity may serve are covered whatever spot
  holds.
- **Growth.** The gap, in units, is covered by whole guaranteed instances
  (`units_per_instance` of each pool), never past `guaranteed_budget_units`
  (a hard cap: the floor is then reported at risk) and within the pools'
  room (headroom less everyone's reservations), spread over halls (the hall
  holding the fewest guaranteed first, then the cheapest pool), so a hall
  failure does not take the whole fallback. A job of many nodes that must run
  in one pool (`whole`) is held in one pool: instances over several pools do
  not run it, so that pool grows until it holds the job, and is never shrunk
  below it.
- **Release.** Guaranteed capacity goes back only against spot that has
  been ready for `release_after_s`, at most `max_release_per_cycle`
  instances per cycle, the dearest first, and never below what the floor
  still needs.

Shortfalls (budget, room) are reported as notes and in `short_units`, so an
operator can see why the floor is at risk.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class ArbiterConfig:
    release_after_s: float = 600.0  # spot ready this long before guaranteed goes back
    max_release_per_cycle: int | None = 1  # guaranteed instances given back per cycle; None: all
    release_fraction: float = 0.0  # ... or this share of those held, when more: a fleet
    # hands back hundreds in a few cycles, not one at a time

    def __post_init__(self) -> None:
        if self.release_after_s < 0:
            raise ValueError(f"release_after_s must be >= 0, got {self.release_after_s}")
        if self.max_release_per_cycle is not None and self.max_release_per_cycle < 1:
            raise ValueError(
                f"max_release_per_cycle must be >= 1 or None, got {self.max_release_per_cycle}"
            )
        if not 0 <= self.release_fraction <= 1:
            raise ValueError(f"release_fraction must be in [0, 1], got {self.release_fraction}")

    def release_limit(self, held: int) -> int | None:
        """Guaranteed instances one cycle may give back of `held`."""
        if self.max_release_per_cycle is None:
            return None
        return max(self.max_release_per_cycle, math.ceil(held * self.release_fraction))


@dataclass(frozen=True, slots=True)
class GuaranteedPlan:
    targets: Mapping[PoolId, int]  # guaranteed instances per pool
    notes: tuple[str, ...]
    need_units: int = 0  # guaranteed units the floor needs now
    short_units: int = 0  # of those, what neither budget nor room allows
    released: int = 0  # instances given back this cycle


def arbitrate(
    snapshot: PartitionSnapshot,
    cfg: ArbiterConfig,
    *,
    cover_units: int | None = None,
    arriving_units: int = 0,
    extra_units: int = 0,
    at_risk_units: int = 0,
    whole: Sequence[int] = (),
) -> GuaranteedPlan:
    """Guaranteed instances per pool so that `cover_units` (default: the floor) hold.

    `arriving_units`: spot the caller counts as arriving in time; `extra_units`:
    guaranteed units wanted beyond the gap (a hedge the caller puts on guaranteed);
    `at_risk_units`: spot that may go at once (the largest pool's), which the floor
    (not the rest of the cover) must survive losing; `whole`: units of gangs (jobs
    of many nodes) no spot pool holds whole: each is held by guaranteed instances in
    one pool (`_homes`), not spread over halls.
    """
    now = snapshot.now
    demand = snapshot.demand
    cover = demand.floor_units if cover_units is None else cover_units
    budget = demand.guaranteed_budget_units
    ready_units = 0
    stable_units = 0
    settled = now - cfg.release_after_s
    held: Counter[PoolId] = Counter()
    idle: Counter[PoolId] = Counter()  # held whose nodes run nothing: released first
    held_units = 0
    for i in snapshot.instances:
        if i.is_spot:
            if i.state is State.READY:
                ready_units += i.units
                if (now if i.ready_at is None else i.ready_at) <= settled:
                    stable_units += i.units
        elif i.is_live:
            held[i.pool] += 1
            held_units += i.units
            idle[i.pool] += i.id not in snapshot.busy
    counted = ready_units + arriving_units
    floor_gap = demand.floor_units - counted + at_risk_units
    # Work that asks for guaranteed capacity needs it whatever spot holds.
    # So do gangs no spot pool holds whole: the spot nodes ready elsewhere cannot run them.
    must = demand.guaranteed_units + sum(whole)
    gap = max(max(0, cover - counted, floor_gap) + extra_units, must)
    need = min(gap, budget)
    notes: list[str] = []
    if gap > budget:
        notes.append(f"floor needs {gap} guaranteed units, budget {budget}")
    pools = [v for v in snapshot.usable(spot=False) if not v.excluded]
    homes = _homes(pools, held, whole)
    if need > held_units or not homes <= held:
        if not pools:
            notes.append("no guaranteed pool")
            return GuaranteedPlan(dict(held), tuple(notes), need, need - held_units)
        base = _shrink(snapshot.pools, held | homes, budget, None, idle, homes)
        base_units = _units(snapshot.pools, base)
        targets, short = _grow(
            pools, Counter(base), need - base_units, budget - base_units, bool(whole)
        )
        if short:
            notes.append(f"floor at risk: {short} guaranteed units found no room")
        for p, n in sorted((homes - held).items()):
            notes.append(f"whole jobs: {n} guaranteed more in {p}, so each runs in one pool")
        added = sum(targets.values()) - sum(base.values())
        if added:
            notes.append(f"floor: {added} guaranteed for spot that cannot arrive in time")
        return GuaranteedPlan(targets, tuple(notes), need, short + max(0, gap - budget))
    still = max(0, cover - stable_units, demand.floor_units - stable_units + at_risk_units)
    keep = max(need, min(held_units, budget, still))
    limit = cfg.release_limit(sum(held.values()))
    targets = _shrink(snapshot.pools, held, keep, limit, idle, homes)
    released = sum(held.values()) - sum(targets.values())
    if released:
        notes.append(
            f"releasing {released} guaranteed: spot ready >= {cfg.release_after_s:.0f}s covers it"
        )
    return GuaranteedPlan(targets, tuple(notes), need, max(0, gap - budget), released)


def _grow(
    pools: list[PoolView],
    held: Counter[PoolId],
    extra_units: int,
    cap_units: int,
    gangs: bool = False,
) -> tuple[dict[PoolId, int], int]:
    """Held plus whole instances for `extra_units`, never more than `cap_units` (the
    budget left): the least-held hall first, then the cheapest pool, so that a hall's
    failure does not take the whole fallback. While gangs wait (`gangs`: jobs that
    must run in one pool, each placed before by `_homes`), the pool holding most
    instead: what is grown beyond today's gangs is then where the next wide job can
    use it (on the bundled workload without notice, spreading it lost 27 % more
    work). Returns the targets and the units neither room nor budget allowed."""
    targets = dict(held)
    room = {v.pool.id: v.available for v in pools}
    per_hall: Counter[str] = Counter()
    for v in pools:
        per_hall[v.pool.hall] += held[v.pool.id]
    remaining, cap = extra_units, cap_units
    while remaining > 0:
        open_pools = [v for v in pools if room[v.pool.id] > 0 and v.pool.units_per_instance <= cap]
        if not open_pools:
            break
        if gangs:
            v = min(open_pools, key=lambda v: (-targets.get(v.pool.id, 0), v.price, v.pool.id))
        else:
            v = min(open_pools, key=lambda v: (per_hall[v.pool.hall], v.price, v.pool.id))
        targets[v.pool.id] = targets.get(v.pool.id, 0) + 1
        room[v.pool.id] -= 1
        per_hall[v.pool.hall] += 1
        remaining -= v.pool.units_per_instance
        cap -= v.pool.units_per_instance
    return targets, max(0, remaining)


def _homes(
    pools: Sequence[PoolView], held: Counter[PoolId], whole: Sequence[int]
) -> Counter[PoolId]:
    """Guaranteed instances per pool that gangs which must run whole (`whole`: their
    units) need there, widest first, each in one pool: the pool holding most of what
    no wider gang took, with room for the rest, then the cheapest. Instances held
    over several pools do not run one job. A gang no pool can hold spans the fewest
    pools it can (those with most to give first), as far as room allows."""
    free = Counter(held)
    room = {v.pool.id: v.available for v in pools}
    homes: Counter[PoolId] = Counter()

    def give(v: PoolView) -> int:
        return free[v.pool.id] + room[v.pool.id]

    def take(p: PoolId, n: int) -> None:
        kept = min(n, free[p])
        free[p] -= kept
        room[p] -= n - kept
        homes[p] += n

    for units in sorted(whole, reverse=True):
        fits = [v for v in pools if give(v) >= math.ceil(units / v.pool.units_per_instance)]
        if fits:
            v = min(fits, key=lambda v: (-free[v.pool.id], v.price, v.pool.id))
            take(v.pool.id, math.ceil(units / v.pool.units_per_instance))
            continue
        left = units
        for v in sorted(pools, key=lambda v: (-give(v), v.price, v.pool.id)):
            if left <= 0:
                break
            n = min(give(v), math.ceil(left / v.pool.units_per_instance))
            if n > 0:
                take(v.pool.id, n)
                left -= n * v.pool.units_per_instance
    return homes


def _unit_of(views: Mapping[PoolId, PoolView], p: PoolId) -> int:
    v = views.get(p)
    return v.pool.units_per_instance if v else 1


def _units(views: Mapping[PoolId, PoolView], instances: Mapping[PoolId, int]) -> int:
    return sum(n * _unit_of(views, p) for p, n in instances.items())


def _shrink(
    views: Mapping[PoolId, PoolView],
    held: Counter[PoolId],
    keep_units: int,
    max_release: int | None,
    idle: Counter[PoolId] | None = None,
    floors: Mapping[PoolId, int] | None = None,
) -> dict[PoolId, int]:
    """Held less at most `max_release` instances (the dearest pool, then one holding
    an idle node, then the fullest), keeping at least `keep_units`, and never below
    `floors` (the instances whole jobs need in a pool). A pool's target cannot say
    which instance goes, so releasing where a node is idle spares the work running
    elsewhere."""
    targets = dict(held)
    idle = Counter(idle or {})
    floors = floors or {}

    def unit_of(p: PoolId) -> int:
        return _unit_of(views, p)

    def price_of(p: PoolId) -> float:
        v = views.get(p)
        return v.price if v else 0.0

    total = _units(views, targets)
    released = 0
    while max_release is None or released < max_release:
        candidates = [
            p
            for p, n in targets.items()
            if n > floors.get(p, 0) and total - unit_of(p) >= keep_units
        ]
        if not candidates:
            break
        p = max(candidates, key=lambda p: (price_of(p), idle[p] > 0, targets[p], p))
        idle[p] -= 1
        targets[p] -= 1
        total -= unit_of(p)
        released += 1
    return {p: n for p, n in targets.items() if n > 0}
