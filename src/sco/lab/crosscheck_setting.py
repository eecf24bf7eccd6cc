"""The SkyServe paper's setting for the cross-check (`sco.lab.crosscheck`): the
evaluation's configuration, its zones and capacity traces, where windows start, the
pools a window offers, and what a window and a policy achieved."""

from __future__ import annotations

import bisect
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from sco.domain.pools import CapacityClass, Pool
from sco.lab.traces import TraceSet

UNLIMITED = 1_000
SCORE_EVERY_S = 300.0


@dataclass(frozen=True, slots=True)
class EvalConfig:
    target: int = 3
    floor: int | None = None  # None: the target
    spot_price: float = 1.0
    od_ratio: float = 3.0
    cold_start_s: float = 120.0
    tick_s: float = 30.0
    window_s: float = 86400.0
    windows: int = 10
    seed: int = 0
    notice_s: float = 0.0
    max_rounds: int = 10

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ValueError(f"target must be >= 1, got {self.target}")
        for name in ("tick_s", "window_s", "spot_price", "od_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cold_start_s < 0 or self.notice_s < 0:
            raise ValueError("cold_start_s and notice_s must be >= 0")
        if self.windows < 1:
            raise ValueError(f"windows must be >= 1, got {self.windows}")

    @property
    def floor_units(self) -> int:
        return self.target if self.floor is None else self.floor


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    times: tuple[float, ...]
    values: tuple[int, ...]
    up_from: tuple[float | None, ...] = field(init=False, compare=False)
    # Running sums to each point: seconds with capacity, and drops to zero.
    up_s: tuple[float, ...] = field(init=False, compare=False)
    drops: tuple[int, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # For each point: when the zone's current run of capacity began (None at 0).
        up: list[float | None] = []
        up_s: list[float] = []
        drops: list[int] = []
        start: float | None = None
        total, n = 0.0, 0
        for k, (t, v) in enumerate(zip(self.times, self.values, strict=True)):
            if k:
                prev_t, prev_v = self.times[k - 1], self.values[k - 1]
                total += (t - prev_t) if prev_v > 0 else 0.0
                n += 1 if prev_v > 0 and v == 0 else 0
            start = (start if start is not None else t) if v > 0 else None
            up.append(start)
            up_s.append(total)
            drops.append(n)
        object.__setattr__(self, "up_from", tuple(up))
        object.__setattr__(self, "up_s", tuple(up_s))
        object.__setattr__(self, "drops", tuple(drops))

    def index(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def at(self, t: float) -> int:
        return self.values[self.index(t)]

    def up_since(self, t: float) -> float | None:
        return self.up_from[self.index(t)]

    def history(self, t: float, window_s: float) -> tuple[int, float]:
        """Drops to zero and hours with capacity over the `window_s` before `t`: what
        the pool's headroom history tells the scorer."""
        i, j = self.index(t - window_s), self.index(t)
        return self.drops[j] - self.drops[i], (self.up_s[j] - self.up_s[i]) / 3600


@dataclass(frozen=True, slots=True)
class Capacity:
    """A trace set as zone capacities over time."""

    name: str
    zones: tuple[Zone, ...]
    binary: bool  # 0/1 traces: 1 means unlimited

    @property
    def start_s(self) -> float:
        return max(z.times[0] for z in self.zones)

    @property
    def end_s(self) -> float:
        return min(z.times[-1] for z in self.zones) + self.tick_s

    @property
    def tick_s(self) -> float:
        z = self.zones[0]
        return (z.times[-1] - z.times[0]) / max(1, len(z.times) - 1)

    def at(self, k: int, t: float) -> int:
        v = self.zones[k].at(t)
        return UNLIMITED if self.binary and v > 0 else v

    @classmethod
    def of(cls, name: str, traces: TraceSet) -> Capacity:
        zones = tuple(Zone(s.name, s.times, s.values) for s in traces.series)
        return cls(name, zones, all(max(s.values) <= 1 for s in traces.series))

    @classmethod
    def from_values(
        cls, name: str, tick_s: float, series: Sequence[tuple[str, Sequence[int]]]
    ) -> Capacity:
        """Series given as values on one tick, aligned at their first value."""
        zones = tuple(
            Zone(n, tuple(i * tick_s for i in range(len(v))), tuple(v)) for n, v in series
        )
        return cls(name, zones, all(max(v) <= 1 for _, v in series))


@dataclass
class WindowResult:
    start_s: float
    counted_s: float = 0.0
    available_s: float = 0.0
    floor_s: float = 0.0
    cost: float = 0.0
    od_cost: float = 0.0
    baseline: float = 0.0
    reclaims: int = 0
    launches: int = 0
    spot_unit_s: float = 0.0
    od_unit_s: float = 0.0
    served_unit_s: float = 0.0  # integral of min(serving, target)
    target_unit_s: float = 0.0
    below_floor_unit_s: float = 0.0

    @property
    def served_fraction(self) -> float:
        return self.served_unit_s / self.target_unit_s if self.target_unit_s else 1.0

    @property
    def below_floor_unit_h(self) -> float:
        return self.below_floor_unit_s / 3600.0

    @property
    def availability(self) -> float:
        return self.available_s / self.counted_s if self.counted_s else 0.0

    @property
    def floor_availability(self) -> float:
        return self.floor_s / self.counted_s if self.counted_s else 0.0

    @property
    def cost_vs_guaranteed(self) -> float:
        return self.cost / self.baseline if self.baseline else 0.0

    @property
    def guaranteed_share(self) -> float:
        total = self.spot_unit_s + self.od_unit_s
        return self.od_unit_s / total if total else 0.0


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    windows: tuple[WindowResult, ...]

    def mean(self, attr: str) -> float:
        return statistics.fmean(float(getattr(w, attr)) for w in self.windows)

    def as_dict(self) -> dict[str, float]:
        return {
            "availability": self.mean("availability"),
            "floor_availability": self.mean("floor_availability"),
            "served_fraction": self.mean("served_fraction"),
            "below_floor_unit_h": self.mean("below_floor_unit_h"),
            "cost_vs_guaranteed": self.mean("cost_vs_guaranteed"),
            "reclaims": self.mean("reclaims"),
            "launches": self.mean("launches"),
            "guaranteed_share": self.mean("guaranteed_share"),
        }


def window_starts(capacity: Capacity, cfg: EvalConfig) -> list[float]:
    """`cfg.windows` seeded start times on the tick grid, lead-in and window inside."""
    lead = cfg.cold_start_s
    first = capacity.start_s + lead
    slack = capacity.end_s - cfg.window_s - first
    if slack < 0:
        have = (capacity.end_s - capacity.start_s) / 3600
        need = (cfg.window_s + lead) / 3600
        raise ValueError(f"{capacity.name}: {have:.1f} h of trace, a window needs {need:.1f} h")
    rng = random.Random(cfg.seed)
    steps = int(slack // cfg.tick_s)
    return [first + rng.randint(0, steps) * cfg.tick_s for _ in range(cfg.windows)]


# ---------------------------------------------------------------- one window


def pools_of(capacity: Capacity, cfg: EvalConfig) -> tuple[list[Pool], Pool]:
    """A spot pool per zone (each its own hall: its own failure domain), and on-demand."""
    spot = [
        Pool("eval", z.name, "gpu", CapacityClass.SPOT, 1, cfg.spot_price) for z in capacity.zones
    ]
    od = Pool(
        "eval", "on-demand", "gpu", CapacityClass.GUARANTEED, 1, cfg.spot_price * cfg.od_ratio
    )
    return spot, od
