"""Simulated time: the same controllers, driven event by event over a trace.

`Simulation.build` checks every input before anything is written, so a bad
trace, demand file or policy fails fast. `run` advances a virtual clock to
the next thing that happens — a region event, a demand change, a controller
cycle — and never sleeps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sim.region import SimConfig, SimRegion
from sco.adapters.sim.traces import TraceSet, load_traces
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import Policy, policy_named
from sco.ports import FleetCounts
from sco.runtime.accounting import Accountant, PartitionMetrics
from sco.runtime.clock import CountingIds, ManualClock
from sco.runtime.controller import ControllerConfig, PartitionController
from sco.runtime.signals import PoolSignals, ReclaimMemory
from sco.runtime.watcher import ExclusionWatcher

Progress = Callable[[float], None]


class SimulationInputError(ValueError):
    """Input that cannot be simulated; the message names the file or option and field."""


@dataclass(frozen=True, slots=True)
class SimulationSpec:
    traces: Path
    demand: Path
    policy: str = "sco"
    duration_s: float | None = None  # None: until the shortest series ends
    start_offset_s: float = 0.0
    seed: int = 0
    cycle_s: float = 30.0
    sim: SimConfig = field(default_factory=SimConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)


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

    def aggregate(self) -> dict[str, float | int]:
        """One line for scripts: availabilities averaged over partitions, costs summed."""
        ms = list(self.partitions.values())
        cost = sum(m.cost for m in ms)
        baseline = sum(m.guaranteed_only_cost for m in ms)
        return {
            "availability": sum(m.availability for m in ms) / len(ms),
            "floor_availability": sum(m.floor_availability for m in ms) / len(ms),
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
        demand: FileDemandSource,
        policy: Policy,
        start_s: float,
        end_s: float,
    ) -> None:
        self.spec = spec
        self.traces = traces
        self.demand = demand
        self.policy = policy
        self.start_s = start_s
        self.end_s = end_s

    @classmethod
    def build(cls, spec: SimulationSpec) -> Simulation:
        """Check every input; raises TraceError, DemandFileError, UnknownPolicy or
        SimulationInputError. Writes nothing."""
        traces = load_traces(spec.traces)
        policy = policy_named(spec.policy)
        if spec.cycle_s <= 0:
            raise SimulationInputError(f"--cycle-s: must be > 0, got {spec.cycle_s}")
        if spec.start_offset_s < 0:
            raise SimulationInputError(f"--start-offset: must be >= 0, got {spec.start_offset_s}")
        start_s = traces.start_s + spec.start_offset_s
        if start_s >= traces.end_s:
            raise SimulationInputError(
                f"--start-offset: {spec.start_offset_s:.0f}s is past the end of {spec.traces}"
            )
        end_s = traces.end_s
        if spec.duration_s is not None:
            if spec.duration_s <= 0:
                raise SimulationInputError(f"--duration: must be > 0, got {spec.duration_s}")
            end_s = min(end_s, start_s + spec.duration_s)
        region_name = traces.region.name or traces.folder.name
        demand = FileDemandSource.load(spec.demand, region_name, start_s)
        return cls(spec, traces, demand, policy, start_s, end_s)

    def run(self, state_url: str, progress: Progress | None = None) -> SimulationResult:
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
        store = SqlFleetStore(state_url)
        try:
            store.upsert_pools(pools)
            ids = CountingIds()
            reclaims = ReclaimMemory()
            signals = PoolSignals()
            event_log = SqlEventLog(store.engine)
            watcher = ExclusionWatcher(event_log, store, pools, on_change=signals.update)
            controllers = [
                PartitionController(
                    partition,
                    provider=region,
                    nodes=region,
                    store=store,
                    demand=self.demand,
                    policy=self.policy,
                    clock=clock,
                    ids=ids,
                    config=self.spec.controller,
                    reclaims=reclaims,
                    signals=signals,
                )
                for partition in self.demand.partitions()
            ]
            cycles = self._loop(
                region, clock, controllers, accountant, progress, watcher, event_log
            )
            exclusions = signals.episodes
            metrics = accountant.finish(self.end_s)
            counts = store.counts()
        finally:
            store.close()
        return SimulationResult(
            spec=self.spec,
            start_s=self.start_s,
            end_s=self.end_s,
            partitions=metrics,
            accountant=accountant,
            region=region,
            counts=counts,
            cycles=cycles,
            wall_s=time.perf_counter() - wall0,
            exclusions=exclusions,
        )

    def _loop(
        self,
        region: SimRegion,
        clock: ManualClock,
        controllers: list[PartitionController],
        accountant: Accountant,
        progress: Progress | None,
        watcher: ExclusionWatcher,
        event_log: SqlEventLog,
    ) -> int:
        span = self.end_s - self.start_s
        next_cycle = self.start_s
        next_demand = self.demand.next_change_after(self.start_s)
        cycles = 0
        while True:
            t = min(
                x
                for x in (region.next_event_time(), next_cycle, next_demand, self.end_s)
                if x is not None
            )
            if t >= self.end_s:
                region.advance_to(self.end_s)
                clock.set(self.end_s)
                break
            region.advance_to(t)
            clock.set(t)
            if next_demand is not None and t >= next_demand:
                accountant.demand_changed(t)
                next_demand = self.demand.next_change_after(t)
            if t >= next_cycle:
                acted = False
                for c in controllers:
                    report = c.cycle()
                    acted = acted or bool(report.transitions or report.created)
                # Events of this cycle reach the watcher before the next cycle plans.
                if acted and event_log.absorb_outbox():
                    watcher.poll(limit=100_000)
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
