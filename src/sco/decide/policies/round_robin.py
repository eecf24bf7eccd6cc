"""Baseline (SkyServe §5, "round robin"): each new replica goes to the next zone in
turn, whether or not the last one took it. Spot only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sco.decide.policies.base import Decision, live_by_pool, spot_views
from sco.domain.snapshot import PartitionSnapshot


@dataclass
class RoundRobinPolicy:
    name: str = "round-robin"
    # As published: what spot cannot hold stays unplaced, nothing falls back.
    keeps_floor: ClassVar[bool] = False
    _next: int = 0  # the zone whose turn it is

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        views = spot_views(snapshot)
        if not views:
            return Decision({}, {}, ("no spot pool",))
        held = live_by_pool(snapshot, spot=True)
        targets = dict(held)
        missing = snapshot.demand.wanted_units - sum(held.values())
        for _ in range(max(0, missing)):
            v = views[self._next % len(views)]
            targets[v.pool.id] = targets.get(v.pool.id, 0) + 1
            self._next += 1
        return Decision({p: n for p, n in targets.items() if n}, {})
