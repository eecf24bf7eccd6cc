"""Simulated time: the same controllers, driven event by event over a trace.

`Simulation.build` checks every input before anything is written, so a bad
trace, demand file or policy fails fast. `run` advances a virtual clock to
the next thing that happens — a region event, a demand change, a controller
cycle — and never sleeps.

The signals run on the same clock: after a cycle that changed something the
outbox is relayed and the exclusion watcher reads the log; every
`score_every_s` the scorer loads the log into an in-process history and
scores the pools, and the controllers plan with those scores from their next
cycle. With `history_dsn` the whole event log is also loaded into pool
history in ClickHouse or chDB at the end, and the last scores come from there.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import Policy, policy_named
from sco.decide.scorer import ScorerConfig
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, PoolScore
from sco.engine import builder
from sco.engine.builder import FleetState, Ports, fleet_signals
from sco.engine.clock import CountingIds, ManualClock
from sco.engine.controller import PartitionController
from sco.engine.cycle import ControllerConfig
from sco.engine.signals_jobs import (
    HistoryLoader,
    ScoringJob,
    score_now,
)
from sco.engine.watcher import ExclusionWatcher
from sco.lab.accounting import Accountant, PartitionMetrics
from sco.lab.history import WindowedHistory
from sco.lab.pacing import Pacer, RelayLog, SignalJobs
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import TraceSet, load_traces
from sco.lab.twins.copy import copy_into
from sco.lab.twins.eventlog import MemoryEventLog
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import DemandSource, EventLog, FleetCounts, FleetStore, SchedulerCluster

if TYPE_CHECKING:
    from sco.adapters.clickhouse.history import ClickHouseHistory

Progress = Callable[[float], None]


class SchedulerSide(Protocol):
    """The schedulers of a simulated world that keep time of their own (a batch queue
    replayed: `sco.lab.workload`): the node plane the controllers act on, and what
    happens between cycles. Without one, the region itself is the node plane."""

    def attach(self, region: SimRegion, clock: ManualClock) -> SchedulerCluster: ...

    def next_event_time(self) -> float | None: ...

    def advance(self, t: float) -> bool:
        """Bring it to `t` (the region is there already); True when its demand may
        have changed."""
        ...


class _Store(FleetStore, Protocol):
    def close(self) -> None: ...


def _state(state_url: str | None, keep_changes: bool = False) -> tuple[_Store, RelayLog]:
    """Fleet state and its event log: in the database at `state_url`, else in memory."""
    if state_url is None:
        memory = MemoryFleetStore(keep_changes)
        return memory, MemoryEventLog(memory)
    store = SqlFleetStore(state_url, contracts=False)  # no node reads one here
    return store, SqlEventLog(store.engine)


class SimulationInputError(ValueError):
    """Input that cannot be simulated; the message names the file or option and field."""


@dataclass(frozen=True, slots=True)
class SimulationSpec:
    traces: Path
    demand: Path
    policy: str | Policy = "sco"  # a name, or (tests) a policy object shared by all
    duration_s: float | None = None  # None: until the shortest series ends
    start_offset_s: float = 0.0
    seed: int = 0
    cycle_s: float = 30.0
    sim: SimConfig = field(default_factory=SimConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    score_every_s: float = 300.0
    headroom_every_s: float = 1800.0  # how often each pool's headroom enters the stream
    history_dsn: str | None = None  # e.g. chdb:///path: also keep pool history there
    # None: every controller cycles every cycle_s. A number: a controller cycles at a
    # tick only when something happened since its last cycle (a region event, a demand
    # change, a new exclusion or score generation, or its last cycle acted), and at
    # least this often otherwise, as an event-driven controller with a resync would.
    idle_resync_s: float | None = None
    # The first seconds of the run fill the fleet from nothing: they count neither
    # availability nor cost (as the evaluation's lead-in), and start at the offset
    # less this much.
    warmup_s: float = 0.0

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else self.policy.name

    def new_policy(self) -> Policy:
        """One per partition: baselines remember what they saw."""
        return policy_named(self.policy) if isinstance(self.policy, str) else self.policy


@dataclass
class SignalTimeline:
    """What the report plots of the signals: scores sampled hourly, every exclusion."""

    every_s: float = 3600.0
    scores: list[tuple[float, PoolId, float]] = field(default_factory=list)
    exclusions: list[Exclusion] = field(default_factory=list)
    _last: float = float("-inf")

    def scored(self, now: float, scores: list[PoolScore]) -> None:
        if now - self._last >= self.every_s:
            self._last = now
            self.scores.extend((now, s.pool, s.value) for s in scores)

    def excluded(self, exclusion: Exclusion) -> None:
        self.exclusions.append(exclusion)

    @property
    def episodes(self) -> int:
        """Exclusions and degradations begun (a cooldown extended is the same one)."""
        return sum(1 for ex in self.exclusions if ex.since == ex.last_crossing)


class _Opening:
    """ClickHouse/chDB pool history, opened on a thread of its own while the run goes
    on; `history` waits for it (and raises what opening it raised). Not an engine's
    executor (the builder makes those): one call, once, at the run's side."""

    def __init__(self, dsn: str) -> None:
        from sco.adapters.clickhouse.history import ClickHouseHistory  # optional extra

        self._opened: ClickHouseHistory | None = None
        self._failed: BaseException | None = None

        def open_it() -> None:
            try:
                self._opened = ClickHouseHistory(dsn)
            except BaseException as e:  # handed to whoever takes the history
                self._failed = e

        self._thread = threading.Thread(target=open_it, name="history-open", daemon=True)
        self._thread.start()

    def history(self) -> ClickHouseHistory:
        self._thread.join()
        if self._failed is not None:
            raise self._failed
        assert self._opened is not None
        return self._opened

    def close(self) -> None:
        """Close it once opened, whether the run got to use it or not."""
        self._thread.join()
        if self._opened is not None:
            self._opened.close()


@dataclass(frozen=True, slots=True)
class SimulationResult:
    spec: SimulationSpec
    start_s: float
    end_s: float
    partitions: dict[str, PartitionMetrics]
    accountant: Accountant
    region: SimRegion
    counts: FleetCounts
    cycles: int
    wall_s: float
    exclusions: int = 0  # exclusions and degradations the watcher wrote
    timeline: SignalTimeline = field(default_factory=SignalTimeline)
    scores: tuple[PoolScore, ...] = ()  # the last generation, best first
    scorings: int = 0
    history_events: int | None = None  # events in the ClickHouse/chDB history, if kept

    @property
    def policy_name(self) -> str:
        return self.spec.policy_name

    def outcome(self) -> tuple[object, ...]:
        """Everything a run decides, without how long it took: two runs of one spec on
        different stores (the twins, a database) must give equal outcomes."""
        return (self.partitions, self.counts, self.cycles, self.exclusions, self.scores)

    def aggregate(self) -> dict[str, float | int]:
        """One line for scripts: availabilities averaged over partitions, costs summed."""
        ms = list(self.partitions.values())
        cost = sum(m.cost for m in ms)
        baseline = sum(m.guaranteed_only_cost for m in ms)
        wanted = sum(m.target_unit_h for m in ms)
        return {
            "availability": sum(m.availability for m in ms) / len(ms),
            "floor_availability": sum(m.floor_availability for m in ms) / len(ms),
            # Unit-weighted over partitions: a big partition's shortfall weighs more.
            "served_fraction": (
                sum(m.served_fraction * m.target_unit_h for m in ms) / wanted if wanted else 1.0
            ),
            "below_floor_unit_h": sum(m.below_floor_unit_h for m in ms),
            "guaranteed_share": sum(m.guaranteed_share for m in ms) / len(ms),
            "cost_vs_guaranteed": cost / baseline if baseline else 0.0,
            "reclaims": sum(m.reclaims for m in ms),
            "creates": sum(m.creates for m in ms),
            "exclusions": self.exclusions,
            "cost": cost,
            "guaranteed_only_cost": baseline,
            "simulated_hours": (self.end_s - self.start_s) / 3600.0,
            "wall_s": self.wall_s,
        }


class Simulation:
    """A simulated region, its fleet state, and one controller per partition."""

    def __init__(
        self,
        spec: SimulationSpec,
        traces: TraceSet,
        demand: DemandSource,
        policy: Policy,
        start_s: float,
        end_s: float,
        side: SchedulerSide | None = None,
    ) -> None:
        self.spec = spec
        self.traces = traces
        self.demand = demand
        self.side = side
        self.policy = policy
        self.start_s = start_s
        self.end_s = end_s

    @classmethod
    def build(cls, spec: SimulationSpec) -> Simulation:
        """Check every input; raises TraceError, DemandFileError, UnknownPolicy or
        SimulationInputError. Writes nothing."""
        traces = load_traces(spec.traces)
        policy = spec.new_policy()
        if spec.cycle_s <= 0:
            raise SimulationInputError(f"--cycle-s: must be > 0, got {spec.cycle_s}")
        if spec.score_every_s <= 0 or spec.headroom_every_s <= 0:
            raise SimulationInputError("score_every_s and headroom_every_s must be > 0")
        if spec.idle_resync_s is not None and spec.idle_resync_s <= 0:
            raise SimulationInputError(f"--idle-resync-s: must be > 0, got {spec.idle_resync_s}")
        if spec.start_offset_s < 0:
            raise SimulationInputError(f"--start-offset: must be >= 0, got {spec.start_offset_s}")
        if not 0 <= spec.warmup_s <= spec.start_offset_s:
            raise SimulationInputError(
                f"warmup_s: must be in [0, the start offset {spec.start_offset_s:.0f}], "
                f"got {spec.warmup_s}"
            )
        start_s = traces.start_s + spec.start_offset_s - spec.warmup_s
        if start_s >= traces.end_s:
            raise SimulationInputError(
                f"--start-offset: {spec.start_offset_s:.0f}s is past the end of {spec.traces}"
            )
        end_s = traces.end_s
        if spec.duration_s is not None:
            if spec.duration_s <= 0:
                raise SimulationInputError(f"--duration: must be > 0, got {spec.duration_s}")
            end_s = min(end_s, start_s + spec.warmup_s + spec.duration_s)
        region_name = traces.region.name or traces.folder.name
        demand = FileDemandSource.load(spec.demand, region_name, start_s)
        return cls(spec, traces, demand, policy, start_s, end_s)

    def run(
        self,
        state_url: str | None = None,
        progress: Progress | None = None,
        copy_to: str | None = None,
    ) -> SimulationResult:
        """Run the simulation; fleet state in the database at `state_url` (its rows kept
        for `sco explain` and `sco pools`), or in memory without one (the twins: the
        same results, faster). With `copy_to` (and no `state_url`), the twins' end
        state is copied into that database (sco.lab.twins.copy)."""
        if copy_to is not None and state_url is not None:
            raise ValueError("copy_to is for runs on the twins: no state_url with it")
        wall0 = time.perf_counter()
        clock = ManualClock(self.start_s)
        region = SimRegion(self.traces, self.spec.sim, start_s=self.start_s)
        pools = list(region.pools())
        spot_units = min(p.units_per_instance for p in pools)
        g_prices = [p.price_per_h for p in pools if not p.is_spot]
        accountant = Accountant(
            pools,
            [p.name for p in self.demand.partitions()],
            self.demand,
            self.start_s,
            guaranteed_price_per_h=min(g_prices) if g_prices else 0.0,
            unit=spot_units,
        )
        region.observer = accountant
        region.report_capacities()
        store, event_log = _state(state_url, keep_changes=copy_to is not None)
        opening: _Opening | None = None
        try:
            # chDB takes about a second to start, mostly off the GIL: it starts beside the run.
            opening = _Opening(self.spec.history_dsn) if self.spec.history_dsn else None
            store.upsert_pools(pools)
            ports = Ports(
                provider=region,
                nodes=region if self.side is None else self.side.attach(region, clock),
                demand=self.demand,
                state=FleetState.of(store),
                clock=clock,
                ids=CountingIds(),
                events=event_log,
            )
            signals = fleet_signals(ports)
            timeline = SignalTimeline()
            watcher = ExclusionWatcher(event_log, store, pools, on_change=timeline.excluded)
            scorer = ScoringJob(
                HistoryLoader(event_log, WindowedHistory(self.spec.scorer.window_s)),
                store,
                {p.id: p for p in pools},
                self.spec.scorer,
                self.spec.score_every_s,
                timeline.scored,
            )
            controllers = builder.controllers(
                ports, self.spec.new_policy, self.spec.controller, signals
            )
            loop = SignalJobs(
                watcher,
                scorer,
                event_log,
                store,
                pools,
                self.spec.headroom_every_s,
                region,
                signals,
            )
            pacer = Pacer(
                region,
                signals,
                self.spec.idle_resync_s,
                [c.partition.name for c in controllers],
            )
            cycles = self._loop(region, clock, controllers, accountant, progress, loop, pacer)
            exclusions = timeline.episodes
            metrics = accountant.finish(self.end_s)
            counts = store.counts()
            last = scorer.run(self.end_s)
            history_events = None
            if opening is not None:
                last, history_events = self._keep_history(opening, event_log, store, pools)
            if copy_to is not None:
                assert isinstance(store, MemoryFleetStore)
                copy_into(store, copy_to)
        finally:
            store.close()
            if opening is not None:
                opening.close()
        return SimulationResult(
            spec=self.spec,
            start_s=self.start_s + self.spec.warmup_s,
            end_s=self.end_s,
            partitions=metrics,
            accountant=accountant,
            region=region,
            counts=counts,
            cycles=cycles,
            wall_s=time.perf_counter() - wall0,
            exclusions=exclusions,
            timeline=timeline,
            scores=tuple(last),
            scorings=scorer.runs,
            history_events=history_events,
        )

    def _keep_history(
        self, opening: _Opening, event_log: EventLog, store: FleetStore, pools: list[Pool]
    ) -> tuple[list[PoolScore], int]:
        """Load the whole log into ClickHouse/chDB history and score from there."""
        history = opening.history()
        HistoryLoader(event_log, history, consumer="history-clickhouse").drain()
        scores = score_now(history, store, {p.id: p for p in pools}, self.end_s, self.spec.scorer)
        return scores, history.count()

    def _loop(
        self,
        region: SimRegion,
        clock: ManualClock,
        controllers: list[PartitionController],
        accountant: Accountant,
        progress: Progress | None,
        signals: SignalJobs,
        pacer: Pacer,
    ) -> int:
        span = self.end_s - self.start_s
        next_cycle = self.start_s
        next_demand = self.demand.next_change_after(self.start_s)
        count_from: float | None = self.start_s + self.spec.warmup_s
        if count_from == self.start_s:
            count_from = None
        # Event-driven controllers react to news of the pools (a reclaim, a notice, new
        # capacity) when it comes, not at the next tick; the rest waits for the tick.
        react = self.spec.idle_resync_s is not None
        pool_news = region.pool_events
        side, queue_moved = self.side, False
        cycles = 0
        while True:
            t = min(
                x
                for x in (
                    region.next_event_time(),
                    next_cycle,
                    next_demand,
                    count_from,
                    self.end_s,
                    side.next_event_time() if side is not None else None,
                )
                if x is not None
            )
            if t >= self.end_s:
                region.advance_to(self.end_s)
                clock.set(self.end_s)
                break
            region.advance_to(t)
            clock.set(t)
            if side is not None:
                queue_moved = side.advance(t) or queue_moved
            if count_from is not None and t >= count_from:
                accountant.restart(t)
                count_from = None
            if next_demand is not None and t >= next_demand:
                accountant.demand_changed(t)
                next_demand = self.demand.next_change_after(t)
                pacer.poke()
            if t >= next_cycle or (react and region.pool_events != pool_news):
                pool_news = region.pool_events
                if queue_moved:  # read at the tick: a queue moves with every job
                    accountant.demand_changed(t)
                    pacer.poke()
                    queue_moved = False
                pacer.signals.refresh(t)  # what the watcher and scorer wrote since
                acted = False
                for k, c in enumerate(controllers):
                    if not pacer.due(k, t):
                        continue
                    report = c.cycle()
                    did = bool(report.transitions or report.created or report.drained)
                    pacer.ran(k, t, did or report.deleted > 0)
                    acted = acted or did
                signals.after_cycle(t, acted)
                cycles += 1
                next_cycle = (
                    self.start_s
                    + math.floor((t - self.start_s) / self.spec.cycle_s + 1) * self.spec.cycle_s
                )
                accountant.maybe_sample(t)
                if progress is not None and cycles % 200 == 0:
                    progress((t - self.start_s) / span)
        if progress is not None:
            progress(1.0)
        return cycles
