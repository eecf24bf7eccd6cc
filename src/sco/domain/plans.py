"""Plans: per partition, a numbered generation of instance targets per pool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sco.domain.pools import PoolId


@dataclass(frozen=True, slots=True)
class PoolReason:
    """Why a plan holds what it holds in one pool, as Nova's weighers log their weights.

    `terms` are what the planner weighed, per instance-hour (hazard terms, price,
    crowding, stickiness): the pool's marginal cost is their sum. `flags` name what
    kept the pool out of placement (excluded, degraded, no room).
    """

    target: int
    held: int
    available: int
    price_per_h: float
    terms: Mapping[str, float] = field(default_factory=dict)
    flags: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "held": self.held,
            "available": self.available,
            "price_per_h": self.price_per_h,
            "terms": dict(self.terms),
            "flags": list(self.flags),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PoolReason:
        return cls(
            target=int(doc["target"]),
            held=int(doc["held"]),
            available=int(doc["available"]),
            price_per_h=float(doc["price_per_h"]),
            terms={str(k): float(v) for k, v in (doc.get("terms") or {}).items()},
            flags=tuple(str(f) for f in doc.get("flags") or ()),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """`pools` and `terms` explain the generation: per pool what was weighed, and the
    partition's own figures (spare, floor need, cold start, notice)."""

    partition: str
    generation: int
    created_at: float
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...] = field(default=())
    pools: Mapping[PoolId, PoolReason] = field(default_factory=dict)
    terms: Mapping[str, float] = field(default_factory=dict)
    # The pools the watcher kept out when it was planned: every cycle asks (`same_decision`).
    _kept_out: dict[PoolId, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for pool, n in {**self.spot, **self.guaranteed}.items():
            if n < 0:
                raise ValueError(f"plan target for {pool} is negative: {n}")
        object.__setattr__(self, "_kept_out", _kept_out(self.pools))

    def targets(self) -> dict[PoolId, int]:
        """Instance target per pool, zeros dropped."""
        return {p: n for p, n in {**self.spot, **self.guaranteed}.items() if n > 0}

    def same_decision(
        self,
        spot: Mapping[PoolId, int],
        guaranteed: Mapping[PoolId, int],
        notes: tuple[str, ...],
        pools: Mapping[PoolId, PoolReason],
    ) -> bool:
        """The same targets for the same reasons (notes, and which pools the watcher
        keeps out): no new generation is needed. What drifts every cycle (a pool's age,
        its room) does not make a new one."""
        return (
            self.same_targets(spot, guaranteed)
            and self.notes == notes
            and self._kept_out == _kept_out(pools)
        )

    def same_targets(self, spot: Mapping[PoolId, int], guaranteed: Mapping[PoolId, int]) -> bool:
        def nz(m: Mapping[PoolId, int]) -> dict[PoolId, int]:
            return {p: n for p, n in m.items() if n > 0}

        return nz(self.spot) == nz(spot) and nz(self.guaranteed) == nz(guaranteed)


def _kept_out(pools: Mapping[PoolId, PoolReason]) -> dict[PoolId, tuple[str, ...]]:
    """The pools the watcher keeps out of placement, and how."""
    signals = ("excluded", "degraded")
    out = {p: tuple(f for f in why.flags if f in signals) for p, why in pools.items() if why.flags}
    return {p: flags for p, flags in out.items() if flags}
