"""Policies side by side on capacity traces, in the SkyServe paper's setting (§5.2).

Semantics, each window (an independent implementation cross-checks these):

- Time moves in decision ticks (`tick_s`, 30 s). A window is `window_s` long and
  starts one cold start early; that lead-in counts neither availability nor cost.
- A zone's capacity at a tick is its trace value at that time (the last point at
  or before it): how many spot instances it can hold. In a 0/1 trace set (every
  series at most 1) a 1 means unlimited.
- Within a tick: (1) reclaims — where a zone holds more than its capacity, the
  newest instances are taken back; (2) the policy acts — it sees the pools
  (headroom, price, its last reclaim and refusal, how long the zone has had
  capacity, and every 5 minutes the scorer's view of the zone's capacity history
  before now), its instances and the demand,
  and sets instance targets per pool; launches that find no room fail at once and
  cost nothing, and the policy is asked again in the same tick (up to
  `max_rounds`) so it may try other zones; (3) readiness is counted: an instance
  serves from `cold_start_s` after its launch until it is reclaimed or terminated.
  The tick counts as available when serving instances >= target (floor likewise).
- With `notice_s` > 0, a policy sees a reclaim that far ahead: the instances a
  zone will lose within the notice (newest first, as holdings stand) show as
  NOTICED and keep serving until taken; headroom counts the coming drop.
- Cost: each instance from launch to termination or reclaim, cold start included,
  spot at `spot_price`, on-demand at `od_ratio` x that, clipped to the counted
  window. `cost_vs_guaranteed` divides by target x on-demand price x window.
- Windows: `windows` start offsets drawn with `seed`, on the tick grid, such that
  lead-in and window fit in the traces.
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sco.decide.policies import Decision, Policy
from sco.decide.scorer import PoolStats, ScorerConfig, score_pools
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.domain.instances import Instance
from sco.domain.lifecycle import State
from sco.domain.pools import CapacityClass, Pool, PoolId
from sco.domain.signals import PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.lab.traces import TraceSet, load_traces

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


@dataclass(slots=True)
class _Inst:
    id: str
    zone: int  # -1: on-demand
    launched: float
    ready_at: float
    noticed: bool = False
    record: Instance | None = None  # the snapshot's view, rebuilt when it changes
    record_key: tuple[bool, bool] = (False, False)


@dataclass
class _Window:
    """One policy over one window: the tick loop of the module docstring."""

    capacity: Capacity
    cfg: EvalConfig
    policy: Policy
    start_s: float
    result: WindowResult = field(init=False)
    insts: dict[str, _Inst] = field(default_factory=dict)
    last_reclaim: dict[int, float] = field(default_factory=dict)
    last_refusal: dict[int, float] = field(default_factory=dict)
    reclaim_times: dict[int, list[float]] = field(default_factory=dict)
    scores: dict[PoolId, PoolScore] = field(default_factory=dict)
    scored_at: float = float("-inf")
    _ids: int = 0

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.result = WindowResult(self.start_s)
        self.end_s = self.start_s + cfg.window_s
        self.od_price = cfg.spot_price * cfg.od_ratio
        self.result.baseline = cfg.target * self.od_price * cfg.window_s / 3600
        self.partition = Partition("eval", "eval", SchedulerKind.KUBERNETES)
        self.demand = Demand(cfg.target, cfg.floor_units, 4 * cfg.target, 4 * cfg.target)
        self.pools, self.od_pool = pools_of(self.capacity, cfg)
        self.scorer = ScorerConfig()
        self.zone_of = {p.id: k for k, p in enumerate(self.pools)}
        self.notice_ticks = int(cfg.notice_s // cfg.tick_s)

    def run(self) -> WindowResult:
        cfg = self.cfg
        t = self.start_s - cfg.cold_start_s
        while t < self.end_s - 1e-9:
            self._reclaim(t)
            if self.notice_ticks:
                self._notice(t)
            self._act(t)
            self._count(t)
            t += cfg.tick_s
        for inst in list(self.insts.values()):
            self._end(inst, self.end_s)
        return self.result

    # ------------------------------------------------------------ world

    def _held(self, k: int) -> list[_Inst]:
        return [i for i in self.insts.values() if i.zone == k]

    def _reclaim(self, t: float) -> None:
        for k in range(len(self.pools)):
            held = self._held(k)
            over = len(held) - self.capacity.at(k, t)
            if over <= 0:
                continue
            for inst in sorted(held, key=lambda i: (i.launched, i.id), reverse=True)[:over]:
                self._end(inst, t)
                if t >= self.start_s:
                    self.result.reclaims += 1
            self.last_reclaim[k] = t
            self.reclaim_times.setdefault(k, []).append(t)

    def _future_cap(self, k: int, t: float) -> int:
        ticks = range(1, self.notice_ticks + 1)
        return min(self.capacity.at(k, t + j * self.cfg.tick_s) for j in ticks)

    def _notice(self, t: float) -> None:
        for k in range(len(self.pools)):
            held = sorted(self._held(k), key=lambda i: (i.launched, i.id), reverse=True)
            doomed = max(0, len(held) - self._future_cap(k, t))
            for n, inst in enumerate(held):
                inst.noticed = n < doomed

    def _end(self, inst: _Inst, t: float) -> None:
        del self.insts[inst.id]
        lo, hi = max(inst.launched, self.start_s), min(t, self.end_s)
        if hi <= lo:
            return
        price = self.od_price if inst.zone < 0 else self.cfg.spot_price
        self.result.cost += price * (hi - lo) / 3600
        if inst.zone < 0:
            self.result.od_cost += price * (hi - lo) / 3600
            self.result.od_unit_s += hi - lo
        else:
            self.result.spot_unit_s += hi - lo

    def _launch(self, zone: int, t: float) -> None:
        self._ids += 1
        inst = _Inst(f"i{self._ids}", zone, t, t + self.cfg.cold_start_s)
        self.insts[inst.id] = inst
        if t >= self.start_s:
            self.result.launches += 1

    def _count(self, t: float) -> None:
        if t < self.start_s:
            return
        serving = sum(1 for i in self.insts.values() if i.ready_at <= t)
        tick = min(self.cfg.tick_s, self.end_s - t)
        r = self.result
        r.counted_s += tick
        if serving >= self.cfg.target:
            r.available_s += tick
        if serving >= self.cfg.floor_units:
            r.floor_s += tick
        r.served_unit_s += min(serving, self.cfg.target) * tick
        r.target_unit_s += self.cfg.target * tick
        r.below_floor_unit_s += max(0, self.cfg.floor_units - serving) * tick

    # ------------------------------------------------------------ policy

    def _act(self, t: float) -> None:
        for _ in range(self.cfg.max_rounds):
            decision = self.policy.decide(self._snapshot(t))
            if not self._apply(decision, t):
                return

    def _apply(self, d: Decision, t: float) -> bool:
        """Reconcile toward the decision; True when a launch was refused."""
        refused = False
        for k, pool in enumerate(self.pools):
            want = d.spot.get(pool.id, 0)
            held = self._held(k)
            live = [i for i in held if not i.noticed]
            if want < len(live):
                self._shrink(live, len(live) - want, t)
            for _ in range(want - len(live)):
                if len(self._held(k)) >= self._room(k, t):
                    self.last_refusal[k] = t
                    refused = True
                    break
                self._launch(k, t)
        want_od = d.guaranteed.get(self.od_pool.id, 0)
        od = self._held(-1)
        if want_od < len(od):
            self._shrink(od, len(od) - want_od, t)
        for _ in range(want_od - len(od)):
            self._launch(-1, t)
        return refused

    def _room(self, k: int, t: float) -> int:
        now = self.capacity.at(k, t)
        return min(now, self._future_cap(k, t)) if self.notice_ticks else now

    def _shrink(self, insts: list[_Inst], n: int, t: float) -> None:
        # Not yet serving first, then the newest: the least sunk cost goes.
        order = sorted(insts, key=lambda i: (i.ready_at <= t, -i.launched, i.id))
        for inst in order[:n]:
            self._end(inst, t)

    def _score(self, t: float) -> None:
        """Every 5 minutes, the scorer on each zone's capacity history (drops per hour
        with capacity over the scorer's window, shrunk toward the peers)."""
        if t - self.scored_at < SCORE_EVERY_S:
            return
        self.scored_at = t
        stats = []
        for k, pool in enumerate(self.pools):
            drops, up_h = self.capacity.zones[k].history(t, self.scorer.window_s)
            stats.append(PoolStats(pool.id, exposure_h=up_h, reclaims=drops))
        scored = score_pools(stats, {p.id: p for p in self.pools}, t, self.scorer)
        self.scores = {s.pool: s for s in scored}

    def _snapshot(self, t: float) -> PartitionSnapshot:
        self._score(t)
        views: dict[PoolId, PoolView] = {}
        for k, pool in enumerate(self.pools):
            held = len(self._held(k))
            times = self.reclaim_times.get(k, [])
            views[pool.id] = PoolView(
                pool=pool,
                headroom=max(0, self._room(k, t) - held),
                last_reclaim_at=self.last_reclaim.get(k),
                last_refusal_at=self.last_refusal.get(k),
                recent_reclaims=sum(1 for x in times if x > t - 3600),
                up_since=self.capacity.zones[k].up_since(t),
                score=self.scores.get(pool.id),
                notice_s=self.cfg.notice_s,
                cold_start_s=self.cfg.cold_start_s,
            )
        views[self.od_pool.id] = PoolView(pool=self.od_pool, headroom=UNLIMITED)
        return PartitionSnapshot(
            partition=self.partition,
            now=t,
            demand=self.demand,
            pools=views,
            instances=tuple(self._record(i, t) for i in self.insts.values()),
        )

    def _record(self, inst: _Inst, t: float) -> Instance:
        ready = inst.ready_at <= t
        key = (ready, inst.noticed)
        if inst.record is None or inst.record_key != key:
            pool = self.od_pool if inst.zone < 0 else self.pools[inst.zone]
            state = State.NOTICED if inst.noticed else State.READY if ready else State.CREATING
            inst.record = Instance(
                id=inst.id,
                partition="eval",
                pool=pool.id,
                capacity_class=pool.capacity_class,
                units=1,
                state=state,
                version=0,
                request_id=inst.id,
                plan_generation=0,
                created_at=inst.launched,
                state_since=t,
                ready_at=inst.ready_at if ready else None,
            )
            inst.record_key = key
        return inst.record


def run_window(capacity: Capacity, cfg: EvalConfig, policy: Policy, start_s: float) -> WindowResult:
    return _Window(capacity, cfg, policy, start_s).run()


PolicyFactory = Callable[[Capacity, EvalConfig, float], Policy]


def registered(name: str) -> PolicyFactory:
    """A factory for a policy of the registry (a fresh one per window)."""
    from sco.decide.policies import policy_named

    policy_named(name)  # unknown names fail here, before any window runs
    return lambda _c, _cfg, _s: policy_named(name)


def optimal(capacity: Capacity, cfg: EvalConfig, start_s: float) -> Policy:
    """The omniscient schedule for one window, solved before it starts."""
    from sco.decide.optimal import solve
    from sco.decide.policies.optimal import OptimalPolicy

    pools, od_pool = pools_of(capacity, cfg)
    lead = round(cfg.cold_start_s / cfg.tick_s)
    t0 = start_s - lead * cfg.tick_s
    ticks = lead + round(cfg.window_s / cfg.tick_s)
    caps = [
        [capacity.at(k, t0 + j * cfg.tick_s) for j in range(ticks)]
        for k in range(len(capacity.zones))
    ]
    cold = int(-(-cfg.cold_start_s // cfg.tick_s))
    schedule = solve(caps, cfg.target, cold, lead, cfg.tick_s, cfg.spot_price, od_pool.price_per_h)
    return OptimalPolicy(schedule, [p.id for p in pools], od_pool.id, t0, cfg.tick_s)


def factory(name: str) -> PolicyFactory:
    return optimal if name == "optimal" else registered(name)


def _one(job: tuple[Capacity, EvalConfig, str, float]) -> WindowResult:
    capacity, cfg, name, start = job
    return run_window(capacity, cfg, factory(name)(capacity, cfg, start), start)


def evaluate_named(
    capacity: Capacity,
    cfg: EvalConfig,
    names: Sequence[str],
    workers: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, PolicyResult]:
    """Every policy over the same seeded windows (a fresh policy object per window),
    the runs spread over `workers` processes."""
    for name in names:
        factory(name)  # unknown names fail before any work
    starts = window_starts(capacity, cfg)
    jobs = [(capacity, cfg, name, s) for name in names for s in starts]
    results: list[WindowResult] = []
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            for r in pool.map(_one, jobs):
                results.append(r)
                if progress is not None:
                    progress(capacity.name, len(results), len(jobs))
    else:
        for job in jobs:
            results.append(_one(job))
            if progress is not None:
                progress(capacity.name, len(results), len(jobs))
    k = len(starts)
    return {
        name: PolicyResult(name, tuple(results[i * k : (i + 1) * k]))
        for i, name in enumerate(names)
    }


def suite(name: str, apache_root: Path) -> list[Capacity]:
    """The trace sets of a named suite, built from the bundled Apache-licensed traces."""
    if name != "spothedge":
        raise ValueError(f"--suite: unknown suite {name!r}; known: spothedge")
    aws1 = Capacity.of("AWS1", load_traces(apache_root / "v100-4node"))
    sixteen = load_traces(apache_root / "v100-16node")
    by_zone = {s.name: s for s in sixteen.series}
    # SkyServe's AWS2: us-east-2b whole, the last 3,274 ticks of the two us-west-2 zones,
    # aligned at their first tick and cut to the shortest.
    parts = [
        ("us-east-2b_v100_1", list(by_zone["us-east-2b_v100_1"].values)),
        ("us-west-2a_v100_1", list(by_zone["us-west-2a_v100_1"].values[-3274:])),
        ("us-west-2c_v100_1", list(by_zone["us-west-2c_v100_1"].values[-3274:])),
    ]
    shortest = min(len(v) for _, v in parts)
    tick = by_zone["us-east-2b_v100_1"].tick_s
    aws2 = Capacity.from_values("AWS2", tick, [(n, v[:shortest]) for n, v in parts])
    # AWS3: the 9-zone trace at its true ~195 s probes (the CSV timestamps).
    aws3 = Capacity.of("AWS3", load_traces(apache_root / "v100-9zone"))
    return [aws1, aws2, aws3]
