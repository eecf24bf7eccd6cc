"""The default policy: hedged, hazard-aware spot with a guaranteed floor
(`sco.decide.hedge`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sco.decide.hedge import HedgeConfig, plan
from sco.decide.policies.base import Decision
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class ScoPolicy:
    config: HedgeConfig = field(default_factory=HedgeConfig)
    name: str = "sco"
    keeps_floor: ClassVar[bool] = True

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        p = plan(snapshot, self.config)
        return Decision(p.spot, p.guaranteed, p.notes, p.pools, p.terms, p.batches)
