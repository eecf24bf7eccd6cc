"""Baseline (SkyServe §5, "even spread"): the target spread evenly over all zones,
each replica bound to its zone; a zone without room leaves its replicas unplaced.
Spot only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sco.decide.policies.base import Decision, spot_views
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class EvenSpreadPolicy:
    name: str = "even-spread"
    # As published: what a zone cannot hold stays unplaced, nothing falls back.
    keeps_floor: ClassVar[bool] = False

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        views = spot_views(snapshot)
        if not views:
            return Decision({}, {}, ("no spot pool",))
        want = snapshot.demand.wanted_units
        spot = {
            v.pool.id: want // len(views) + (1 if k < want % len(views) else 0)
            for k, v in enumerate(views)
        }
        return Decision({p: n for p, n in spot.items() if n}, {})
