"""Pool signals: exclusions from the watcher and scores from the scorer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sco.domain.pools import PoolId


class ExclusionState(StrEnum):
    EXCLUDED = "excluded"  # no new placement until `until`
    DEGRADED = "degraded"  # would have been excluded, but it is among the last candidates


@dataclass(frozen=True, slots=True)
class Exclusion:
    pool: PoolId
    state: ExclusionState
    since: float
    until: float
    cooldown_s: float
    last_crossing: float  # the last time a threshold was crossed in this pool
    reason: str
    version: int = 0

    def active(self, now: float) -> bool:
        return now < self.until


@dataclass(frozen=True, slots=True)
class PoolScore:
    """What a pool's history says, each figure with its sample size."""

    pool: PoolId
    generation: int
    computed_at: float
    hazard_per_h: float  # reclaims per instance-hour, shrunk toward peers
    exposure_h: float  # instance-hours observed
    reclaims: int
    survival: float  # probability an instance survives the planning horizon
    success_ratio: float  # creates accepted / attempted, shrunk toward peers
    attempts: int
    ready_p50_s: float | None
    ready_n: int
    headroom: float | None  # mean recent headroom
    headroom_n: int
    value: float  # the planner's 0..1 summary: survival x success
    why: str
