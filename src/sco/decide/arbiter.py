"""Fallback arbiter: keeps the floor with guaranteed capacity.

Only READY spot counts toward the floor: a spot instance that is booting, or
has been noticed, may never arrive or is leaving. Guaranteed capacity is given
back only when spot has been ready for `release_after_s`, a bounded number of
instances per cycle, and never so that stable spot plus what stays falls
below the floor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sco.domain.instances import units
from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class ArbiterConfig:
    release_after_s: float = 600.0  # spot must have been ready this long to replace guaranteed
    max_release_per_cycle: int = 1  # guaranteed instances given back per cycle

    def __post_init__(self) -> None:
        if self.release_after_s < 0:
            raise ValueError(f"release_after_s must be >= 0, got {self.release_after_s}")
        if self.max_release_per_cycle < 1:
            raise ValueError(
                f"max_release_per_cycle must be >= 1, got {self.max_release_per_cycle}"
            )


@dataclass(frozen=True, slots=True)
class GuaranteedPlan:
    targets: Mapping[PoolId, int]
    notes: tuple[str, ...]


def arbitrate(
    snapshot: PartitionSnapshot, cfg: ArbiterConfig, cover_units: int | None = None
) -> GuaranteedPlan:
    """Guaranteed instance target per pool so that the floor holds.

    `cover_units` overrides what guaranteed must cover (default: the floor),
    for policies that cover the whole target.
    """
    now = snapshot.now
    floor = snapshot.demand.floor_units if cover_units is None else cover_units
    budget = snapshot.demand.guaranteed_budget_units
    ready_spot = [i for i in snapshot.instances if i.is_spot and i.state is State.READY]
    stable_spot = [i for i in ready_spot if (i.ready_at or now) <= now - cfg.release_after_s]
    guaranteed = [i for i in snapshot.instances if not i.is_spot and i.is_live]
    held = Counter(i.pool for i in guaranteed)
    held_units = units(guaranteed)

    need_units = min(max(0, floor - units(ready_spot)), budget)
    notes: list[str] = []
    if floor - units(ready_spot) > budget:
        notes.append(f"floor needs {floor - units(ready_spot)} guaranteed units, budget {budget}")
    if need_units >= held_units:
        targets, short = _grow(snapshot, held, need_units - held_units)
        if short:
            notes.append(f"floor at risk: {short} guaranteed units found no quota")
        return GuaranteedPlan(targets, tuple(notes))

    # Surplus: give back only what stable spot covers, a few at a time.
    keep_units = max(need_units, min(max(0, floor - units(stable_spot)), budget))
    targets = _shrink(snapshot.pools, held, keep_units, cfg.max_release_per_cycle)
    released = sum(held.values()) - sum(targets.values())
    if released:
        notes.append(f"releasing {released} guaranteed: spot ready >= {cfg.release_after_s:.0f}s")
    return GuaranteedPlan(targets, tuple(notes))


def _guaranteed_pools(snapshot: PartitionSnapshot) -> list[PoolView]:
    return [v for v in snapshot.usable(spot=False) if not v.excluded]


def _grow(
    snapshot: PartitionSnapshot, held: Counter[PoolId], extra_units: int
) -> tuple[dict[PoolId, int], int]:
    """Held plus new instances for `extra_units`: cheapest first, spread over halls."""
    targets = dict(held)
    pools = _guaranteed_pools(snapshot)
    room = {v.pool.id: v.available for v in pools}
    per_hall = Counter[str]()
    for v in pools:
        per_hall[v.pool.hall] += held[v.pool.id]
    remaining = extra_units
    while remaining > 0:
        open_pools = [v for v in pools if room[v.pool.id] > 0]
        if not open_pools:
            break
        v = min(open_pools, key=lambda v: (per_hall[v.pool.hall], v.price, v.pool.id))
        targets[v.pool.id] = targets.get(v.pool.id, 0) + 1
        room[v.pool.id] -= 1
        per_hall[v.pool.hall] += 1
        remaining -= v.pool.units_per_instance
    return targets, max(0, remaining)


def _shrink(
    views: Mapping[PoolId, PoolView], held: Counter[PoolId], keep_units: int, max_release: int
) -> dict[PoolId, int]:
    """Held minus at most `max_release` instances, keeping at least `keep_units`."""
    targets = dict(held)

    def unit_of(p: PoolId) -> int:
        v = views.get(p)
        return v.pool.units_per_instance if v else 1

    total = sum(n * unit_of(p) for p, n in targets.items())
    for _ in range(max_release):
        # The most expensive pool with the most held goes first.
        candidates = [p for p, n in targets.items() if n > 0 and total - unit_of(p) >= keep_units]
        if not candidates:
            break
        p = max(candidates, key=lambda p: (views[p].price if p in views else 0.0, targets[p], p))
        targets[p] -= 1
        total -= unit_of(p)
    return {p: n for p, n in targets.items() if n > 0}
