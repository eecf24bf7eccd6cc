"""`optimal`: replays the omniscient schedule of `sco.decide.optimal`.

It knows the future, so only the evaluation builds it (with the capacities of
the whole window); it cannot run in a controller and is not in the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from sco.decide.optimal import Schedule
from sco.decide.policies.base import Decision
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class OptimalPolicy:
    schedule: Schedule
    spot_pools: Sequence[PoolId]  # in the schedule's zone order
    od_pool: PoolId
    t0: float  # the time of tick 0
    tick_s: float
    name: str = "optimal"
    keeps_floor: ClassVar[bool] = True

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        k = round((snapshot.now - self.t0) / self.tick_s)
        k = min(max(k, 0), len(self.schedule.on_demand) - 1)
        spot = {
            p: self.schedule.spot[z][k]
            for z, p in enumerate(self.spot_pools)
            if self.schedule.spot[z][k]
        }
        od = self.schedule.on_demand[k]
        return Decision(spot, {self.od_pool: od} if od else {})
