"""Pools: where instances of one flavor can be had, and their capacity class."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

PoolId = str


class CapacityClass(StrEnum):
    SPOT = "spot"
    GUARANTEED = "guaranteed"


@dataclass(frozen=True, slots=True)
class Pool:
    """One `region/hall/flavor[/aggregate]` with a capacity class and a price.

    `price_per_h` is the list price per instance-hour; a provider may report a
    different current price (spot prices move), which the snapshot carries.
    `notice_s` is the reclaim notice the pool's reclaimer promises (0: none);
    `cold_start_s`, when known, the time from create to a ready node there
    (otherwise history measures it).
    """

    region: str
    hall: str
    flavor: str
    capacity_class: CapacityClass
    units_per_instance: int
    price_per_h: float
    aggregate: str | None = None
    notice_s: float = 0.0
    cold_start_s: float | None = None
    id: PoolId = field(init=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("region", "hall", "flavor"):
            value = getattr(self, name)
            if not value or "/" in value:
                raise ValueError(f"pool {name} must be non-empty without '/': {value!r}")
        if self.aggregate is not None and (not self.aggregate or "/" in self.aggregate):
            raise ValueError(f"pool aggregate must be non-empty without '/': {self.aggregate!r}")
        if self.units_per_instance < 1:
            raise ValueError(f"units_per_instance must be >= 1, got {self.units_per_instance}")
        if self.price_per_h < 0:
            raise ValueError(f"price_per_h must be >= 0, got {self.price_per_h}")
        if self.notice_s < 0:
            raise ValueError(f"notice_s must be >= 0, got {self.notice_s}")
        if self.cold_start_s is not None and self.cold_start_s < 0:
            raise ValueError(f"cold_start_s must be >= 0, got {self.cold_start_s}")
        parts = [self.region, self.hall, self.flavor]
        if self.aggregate:
            parts.append(self.aggregate)
        # Read on every hot path; computed once.
        object.__setattr__(self, "id", "/".join(parts))

    @property
    def is_spot(self) -> bool:
        return self.capacity_class is CapacityClass.SPOT
