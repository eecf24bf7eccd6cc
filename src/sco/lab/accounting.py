"""What a simulated run achieved: availability, served fraction, cost, reclaims, time
to replace.

Availability (the share of time at target) suits a service of a few replicas; a
fleet is better read by its served fraction, the unit-hours running (up to the
target) over the unit-hours wanted, and by the unit-hours spent below the floor.

The accountant listens to the simulated region (the truth, not the
controller's view) and integrates exactly over time: every quantity is
piecewise constant between the events it is told about.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sco.domain.pools import Pool, PoolId
from sco.ports import DemandSource

MAX_PAIR_S = 3600.0  # a reclaim not replaced within this long counts as not replaced


@dataclass(frozen=True, slots=True)
class PartitionMetrics:
    partition: str
    seconds: float
    availability: float  # share of time running units >= target
    floor_availability: float  # share of time running units >= floor
    served_fraction: float  # integral of min(running, target) over that of target, in units
    below_floor_unit_h: float  # integral of the units missing below the floor
    target_unit_h: float  # integral of the target: what was wanted
    cost: float  # instance-hours x price, from create to deletion, cold start included
    guaranteed_only_cost: float  # the target met with guaranteed capacity alone
    reclaims: int  # instances reclaimed (announced or not)
    creates: int  # instances the provider accepted
    guaranteed_share: float  # of held unit-hours, on guaranteed capacity
    mean_replace_s: float | None  # reclaim -> a replacement created after it is ready
    replaced: int

    @property
    def cost_vs_guaranteed(self) -> float:
        return self.cost / self.guaranteed_only_cost if self.guaranteed_only_cost else 0.0

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "partition": self.partition,
            "availability": self.availability,
            "floor_availability": self.floor_availability,
            "served_fraction": self.served_fraction,
            "below_floor_unit_h": self.below_floor_unit_h,
            "cost": self.cost,
            "guaranteed_only_cost": self.guaranteed_only_cost,
            "cost_vs_guaranteed": self.cost_vs_guaranteed,
            "reclaims": self.reclaims,
            "creates": self.creates,
            "guaranteed_share": self.guaranteed_share,
            "mean_replace_s": self.mean_replace_s,
            "replaced": self.replaced,
            "hours": self.seconds / 3600.0,
        }


@dataclass
class _Part:
    t: float
    running: int = 0
    target: int = 0
    floor: int = 0
    ok_target_s: float = 0.0
    ok_floor_s: float = 0.0
    total_s: float = 0.0
    served_unit_s: float = 0.0
    target_unit_s: float = 0.0
    below_floor_unit_s: float = 0.0
    baseline_cost: float = 0.0
    cost: float = 0.0
    spot_unit_s: float = 0.0
    guaranteed_unit_s: float = 0.0
    reclaims: int = 0
    creates: int = 0
    pending: deque[float] = field(default_factory=deque)
    replace_s: list[float] = field(default_factory=list)


@dataclass
class _PoolAcc:
    pool: Pool
    t: float
    price: float
    held: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    capacity: int = 0


@dataclass(frozen=True, slots=True)
class Series:
    """Change points for the report: times and values side by side."""

    t: list[float]
    values: dict[str, list[float]]


class Accountant:
    """Implements the simulator's observer; `finish` gives the metrics.

    The observer methods take the whole event; not every metric needs every field.
    """

    def __init__(
        self,
        pools: Sequence[Pool],
        partitions: Sequence[str],
        demand: DemandSource,
        start_s: float,
        guaranteed_price_per_h: float,
        unit: int,
        sample_every_s: float = 600.0,
    ) -> None:
        self.start_s = start_s
        self.demand = demand
        self.g_price = guaranteed_price_per_h
        self.unit = unit
        self.sample_every_s = sample_every_s
        self._pools = {p.id: _PoolAcc(p, start_s, p.price_per_h) for p in pools}
        self._parts = {name: _Part(start_s) for name in partitions}
        self.capacity_series: dict[str, list[tuple[float, int, int, float]]] = {
            name: [] for name in partitions
        }
        self.pool_series: dict[PoolId, list[tuple[float, int, int]]] = {p: [] for p in self._pools}
        self.cost_series: list[tuple[float, dict[str, float], dict[str, float]]] = []
        self._next_sample = start_s
        self.demand_changed(start_s)

    # ------------------------------------------------------------ integration

    def _flush_part(self, name: str, t: float) -> None:
        p = self._parts[name]
        dt = t - p.t
        if dt > 0:
            p.total_s += dt
            if p.running >= p.target:
                p.ok_target_s += dt
            if p.running >= p.floor:
                p.ok_floor_s += dt
            p.served_unit_s += min(p.running, p.target) * dt
            p.target_unit_s += p.target * dt
            p.below_floor_unit_s += max(0, p.floor - p.running) * dt
            p.baseline_cost += (
                math.ceil(max(p.target, p.floor) / self.unit) * self.g_price * dt / 3600
            )
        p.t = max(p.t, t)

    def _flush_pool(self, pool: PoolId, t: float) -> None:
        acc = self._pools[pool]
        dt = t - acc.t
        if dt > 0:
            units = acc.pool.units_per_instance
            for name, n in acc.held.items():
                if n and name in self._parts:
                    part = self._parts[name]
                    part.cost += n * acc.price * dt / 3600
                    if acc.pool.is_spot:
                        part.spot_unit_s += n * units * dt
                    else:
                        part.guaranteed_unit_s += n * units * dt
        acc.t = max(acc.t, t)

    def _point(self, name: str, t: float) -> None:
        p = self._parts[name]
        self.capacity_series[name].append((t, p.running, p.target, float(p.floor)))

    def _pool_point(self, pool: PoolId, t: float) -> None:
        acc = self._pools[pool]
        self.pool_series[pool].append((t, acc.capacity, sum(acc.held.values())))

    # ------------------------------------------------------------ SimObserver

    def held(self, t: float, pool: PoolId, partition: str, delta: int) -> None:
        self._flush_pool(pool, t)
        self._pools[pool].held[partition] += delta
        self._pool_point(pool, t)

    def running(
        self, t: float, partition: str, pool: PoolId, delta_units: int, created_at: float
    ) -> None:
        if partition not in self._parts:
            return
        self._flush_part(partition, t)
        p = self._parts[partition]
        p.running += delta_units
        if delta_units > 0:
            self._pair_replacement(p, t, created_at)
        self._point(partition, t)

    def price(self, t: float, pool: PoolId, price_per_h: float) -> None:
        self._flush_pool(pool, t)
        self._pools[pool].price = price_per_h

    def capacity(self, t: float, pool: PoolId, instances: int) -> None:
        self._pools[pool].capacity = instances
        self._pool_point(pool, t)

    def reclaimed(
        self, t: float, partition: str, pool: PoolId, units: int, notice_s: float
    ) -> None:
        if partition in self._parts:
            p = self._parts[partition]
            p.reclaims += 1
            p.pending.append(t)

    def created(self, t: float, partition: str, pool: PoolId, count: int) -> None:
        if partition in self._parts:
            self._parts[partition].creates += count

    # ------------------------------------------------------------ from the runner

    def demand_changed(self, t: float) -> None:
        for name, p in self._parts.items():
            self._flush_part(name, t)
            d = self.demand.demand(name, t)
            p.target, p.floor = d.target_units, d.floor_units
            self._point(name, t)

    def maybe_sample(self, t: float) -> None:
        if t < self._next_sample:
            return
        self._next_sample = t + self.sample_every_s
        self._flush_all(t)
        self.cost_series.append(
            (
                t,
                {n: p.cost for n, p in self._parts.items()},
                {n: p.baseline_cost for n, p in self._parts.items()},
            )
        )

    def restart(self, t: float) -> None:
        """Count from `t` on: what ran before (a warm-up) neither serves nor costs."""
        self._flush_all(t)
        for name, p in self._parts.items():
            fresh = _Part(t, running=p.running, target=p.target, floor=p.floor)
            self._parts[name] = fresh
        self.cost_series.clear()

    def _flush_all(self, t: float) -> None:
        for pool in self._pools:
            self._flush_pool(pool, t)
        for name in self._parts:
            self._flush_part(name, t)

    def _pair_replacement(self, p: _Part, t: float, created_at: float) -> None:
        while p.pending and t - p.pending[0] > MAX_PAIR_S:
            p.pending.popleft()
        if p.pending and created_at >= p.pending[0]:
            p.replace_s.append(t - p.pending.popleft())

    def finish(self, t: float) -> dict[str, PartitionMetrics]:
        self._flush_all(t)
        out: dict[str, PartitionMetrics] = {}
        for name, p in self._parts.items():
            held_unit_s = p.spot_unit_s + p.guaranteed_unit_s
            out[name] = PartitionMetrics(
                partition=name,
                seconds=p.total_s,
                availability=p.ok_target_s / p.total_s if p.total_s else 0.0,
                floor_availability=p.ok_floor_s / p.total_s if p.total_s else 0.0,
                served_fraction=p.served_unit_s / p.target_unit_s if p.target_unit_s else 1.0,
                below_floor_unit_h=p.below_floor_unit_s / 3600.0,
                target_unit_h=p.target_unit_s / 3600.0,
                cost=p.cost,
                guaranteed_only_cost=p.baseline_cost,
                reclaims=p.reclaims,
                creates=p.creates,
                guaranteed_share=p.guaranteed_unit_s / held_unit_s if held_unit_s else 0.0,
                mean_replace_s=sum(p.replace_s) / len(p.replace_s) if p.replace_s else None,
                replaced=len(p.replace_s),
            )
        return out
