"""Baseline: greedy on price. Spot in the cheapest pools with headroom; what spot
cannot hold goes on guaranteed capacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.policies.base import Decision, live_by_pool, ready_spot_units, spot_views
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class CheapestPolicy:
    name: str = "cheapest"
    keeps_floor: ClassVar[bool] = True

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        want = snapshot.demand.wanted_units
        held = live_by_pool(snapshot, spot=True)
        spot: dict[PoolId, int] = {}
        placed = 0
        for v in sorted(spot_views(snapshot), key=lambda v: (v.price, v.pool.id)):
            if placed >= want:
                break
            room = held[v.pool.id] + (0 if v.excluded else v.available)
            n = min(room, -(-(want - placed) // v.pool.units_per_instance))
            if n > 0:
                spot[v.pool.id] = n
                placed += n * v.pool.units_per_instance
        # Spot planned counts as arriving: guaranteed covers only what spot cannot hold.
        arriving = max(0, placed - ready_spot_units(snapshot))
        g = arbitrate(snapshot, _AT_ONCE, cover_units=want, arriving_units=arriving)
        return Decision(spot, g.targets, g.notes)


_AT_ONCE = ArbiterConfig(release_after_s=0.0, max_release_per_cycle=None)
