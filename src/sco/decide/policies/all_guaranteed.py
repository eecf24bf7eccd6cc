"""Baseline: every wanted unit on guaranteed capacity, no spot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.policies.base import Decision
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class AllGuaranteedPolicy:
    arbiter: ArbiterConfig = field(default_factory=lambda: ArbiterConfig(release_after_s=0))
    name: str = "all-guaranteed"
    keeps_floor: ClassVar[bool] = True

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        wanted = snapshot.demand.wanted_units
        g = arbitrate(snapshot, self.arbiter, cover_units=wanted)
        return Decision({}, g.targets, g.notes)
