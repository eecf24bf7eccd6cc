"""Plans: per partition, a numbered generation of instance targets per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sco.domain.pools import PoolId


@dataclass(frozen=True, slots=True)
class Plan:
    partition: str
    generation: int
    created_at: float
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for pool, n in {**self.spot, **self.guaranteed}.items():
            if n < 0:
                raise ValueError(f"plan target for {pool} is negative: {n}")

    def targets(self) -> dict[PoolId, int]:
        """Instance target per pool, zeros dropped."""
        return {p: n for p, n in {**self.spot, **self.guaranteed}.items() if n > 0}

    def same_targets(self, spot: Mapping[PoolId, int], guaranteed: Mapping[PoolId, int]) -> bool:
        def nz(m: Mapping[PoolId, int]) -> dict[PoolId, int]:
            return {p: n for p, n in m.items() if n > 0}

        return nz(self.spot) == nz(spot) and nz(self.guaranteed) == nz(guaranteed)
