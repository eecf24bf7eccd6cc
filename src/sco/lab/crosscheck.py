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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sco.decide.policies import Decision, Policy
from sco.decide.scorer import PoolStats, ScorerConfig, score_pools
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.domain.instances import Instance
from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
from sco.domain.signals import PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.lab.crosscheck_setting import (
    SCORE_EVERY_S,
    UNLIMITED,
    Capacity,
    EvalConfig,
    PolicyResult,
    WindowResult,
    pools_of,
    window_starts,
)
from sco.lab.sweep import IN_PROCESS, Workers, sweep
from sco.lab.traces import load_traces


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
    workers: Workers = IN_PROCESS,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, PolicyResult]:
    """Every policy over the same seeded windows of one trace set (`evaluate_all`)."""
    return evaluate_all([capacity], cfg, names, workers, progress)[capacity.name]


def evaluate_all(
    capacities: Sequence[Capacity],
    cfg: EvalConfig,
    names: Sequence[str],
    workers: Workers = IN_PROCESS,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, dict[str, PolicyResult]]:
    """Per trace set, every policy over the same seeded windows (a fresh policy object
    per window): all the runs in one sweep over `workers`, so none waits for another
    trace set's last run."""
    for name in names:
        factory(name)  # unknown names fail before any work
    starts = {c.name: window_starts(c, cfg) for c in capacities}
    # Policy by policy across the trace sets: the dearest runs (the LP bound's, on the
    # longest trace) start first rather than last, where they would hold a sweep's end.
    jobs = [(c, cfg, name, s) for name in names for c in capacities for s in starts[c.name]]
    done: dict[str, int] = {}

    def tick(n: int, _total: int) -> None:
        name = jobs[n - 1][0].name
        done[name] = done.get(name, 0) + 1
        if progress is not None:
            progress(name, done[name], len(names) * len(starts[name]))

    runs: dict[tuple[str, str], list[WindowResult]] = {}
    for job, r in zip(jobs, sweep(_one, jobs, workers, tick), strict=True):
        runs.setdefault((job[0].name, job[2]), []).append(r)
    return {
        c.name: {name: PolicyResult(name, tuple(runs[c.name, name])) for name in names}
        for c in capacities
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
