"""What a controller observed, as one immutable value the decisions read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sco.domain.demand import Demand, Partition
from sco.domain.instances import Instance
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import PoolScore


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool as seen in one cycle.

    headroom: more instances that fit now, per the provider (cached);
    reserved: pending reservations of all partitions not yet seen as servers;
    version: the pool row's compare-and-swap counter for reservations.
    """

    pool: Pool
    headroom: int
    reserved: int = 0
    price_per_h: float | None = None
    excluded: bool = False  # the watcher took it out: nothing new goes there
    degraded: bool = False  # failing, but among the last candidates: placed with less weight
    # Discovery does not list it, yet the partition holds servers there (fleet state
    # knows it): it keeps them and gets nothing new, as an excluded pool.
    undiscovered: bool = False
    recent_reclaims: int = 0
    last_reclaim_at: float | None = None  # the latest reclaim seen in this pool
    last_refusal_at: float | None = None  # the latest create it refused
    # Since when the pool has continuously had capacity for spot (held + headroom > 0),
    # from its headroom history; None when unknown. Hazard falls with this age.
    up_since: float | None = None
    notice_s: float = 0.0  # the reclaim notice this pool's provider guarantees (contract)
    cold_start_s: float | None = None  # create to ready here: configured, or measured; None
    # when neither is known
    score: PoolScore | None = None  # the scorer's latest word on this pool, if any yet
    version: int = 0
    available: int = field(init=False, compare=False)  # headroom less reservations, >= 0
    # What an instance costs here now: the provider's price, else the region file's
    # (a plan asks dozens of times).
    price: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "available", max(0, self.headroom - self.reserved))
        price = self.pool.price_per_h if self.price_per_h is None else self.price_per_h
        object.__setattr__(self, "price", price)


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    partition: Partition
    now: float
    demand: Demand
    pools: Mapping[PoolId, PoolView]
    instances: tuple[Instance, ...]  # this partition's non-terminal records
    plan: Plan | None = None
    busy: frozenset[str] = frozenset()  # instances whose nodes run work: the last to go
    # usable(True) and usable(False), sorted once: a cycle's decisions ask several times
    _usable: tuple[tuple[PoolView, ...], tuple[PoolView, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        accepts = self.partition.accepts
        mine = sorted(
            (v for v in self.pools.values() if accepts(v.pool.flavor)), key=lambda v: v.pool.id
        )
        spot = tuple(v for v in mine if v.pool.is_spot)
        guaranteed = tuple(v for v in mine if not v.pool.is_spot)
        object.__setattr__(self, "_usable", (guaranteed, spot))

    def usable(self, spot: bool) -> list[PoolView]:
        """The spot (or guaranteed) pools this partition may use, by pool id."""
        return list(self._usable[spot])
