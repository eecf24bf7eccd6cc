"""Policies side by side at fleet scale: whole simulations over seeded 24 h windows.

Where `sco.lab.crosscheck` replays the SkyServe setting (one service of a
few replicas, in its own tick model), this runs the product itself: the
simulated region, one controller per partition, the fleet state, the scorer
and the watcher (`sco.lab.simulation`), once per scenario, policy and
window. Every policy sees the same windows.

`optimal` is not a run but a bound: the LP relaxation of the omniscient
schedule (`sco.decide.optimal`) for the partitions' summed target at every
cycle, on the same pools, capacities and prices the simulated region has
(read from a region that runs no servers), with guaranteed capacity
unlimited. It serves the whole target, so its served fraction and
availabilities are 1 by construction; its cost is what no policy can beat.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sco.decide.policies import policy_named
from sco.lab.fleet import FLEET
from sco.lab.region import SimConfig, SimRegion
from sco.lab.simulation import Simulation, SimulationInputError, SimulationSpec
from sco.lab.sweep import IN_PROCESS, Workers, sweep
from sco.lab.traces import load_traces

DAY_S = 86400.0
# What a window's result says, averaged over windows (the paper-setting suite's keys).
KEYS = (
    "availability",
    "floor_availability",
    "served_fraction",
    "below_floor_unit_h",
    "cost_vs_guaranteed",
    "reclaims",
    "launches",
    "guaranteed_share",
)


@dataclass(frozen=True, slots=True)
class FleetCase:
    """One scenario: a trace set at a scale, and the demand on it."""

    name: str
    traces: Path
    demand: Path
    sim: SimConfig  # pool size, guaranteed quota; the notice is set per run

    def spec(
        self, policy: str, offset_s: float, window_s: float, notice_s: float
    ) -> SimulationSpec:
        """The window counts from `offset_s` + `WARMUP_S` after the trace's start: the
        fleet fills from nothing during the warm-up, which counts nothing."""
        return SimulationSpec(
            traces=self.traces,
            demand=self.demand,
            policy=policy,
            duration_s=window_s,
            start_offset_s=offset_s + WARMUP_S,
            warmup_s=WARMUP_S,
            sim=replace(self.sim, notice_s=notice_s),
            idle_resync_s=RESYNC_S,
        )


# Event-driven cycles, as a deployment runs them: a partition cycles when something
# happened to it, and at least this often.
RESYNC_S = 300.0
WARMUP_S = 900.0


def fleet_suite(folder: Path, traces_root: Path) -> list[FleetCase]:
    """The named fleet scenarios (`sco.lab.fleet.FLEET`), their demand files
    written under `folder`."""
    return [
        FleetCase(
            s.name,
            traces_root.joinpath(*s.trace),
            s.write_demand(folder),
            s.sim_config(),
        )
        for s in FLEET.values()
    ]


def window_offsets(case: FleetCase, windows: int, window_s: float, seed: int) -> list[float]:
    """`windows` seeded offsets from the traces' start, on the 30 s grid, each window
    inside the traces."""
    traces = load_traces(case.traces)
    slack = traces.end_s - traces.start_s - window_s - WARMUP_S
    if slack < 0:
        raise SimulationInputError(
            f"{case.traces}: {(traces.end_s - traces.start_s) / 3600:.1f} h of trace, "
            f"a window needs {window_s / 3600:.1f} h"
        )
    rng = random.Random(seed)
    grid = int(slack // 30)
    return [30.0 * rng.randint(0, grid) for _ in range(windows)]


def run_window(
    case: FleetCase, policy: str, offset_s: float, window_s: float, notice_s: float
) -> dict[str, float]:
    """One policy over one window: the simulation's aggregate, in the suite's keys."""
    if policy == "optimal":
        return bound(case, offset_s, window_s, notice_s)
    # On the in-memory twins: the same results as on a database (tested), sooner.
    agg = Simulation.build(case.spec(policy, offset_s, window_s, notice_s)).run().aggregate()
    return {
        "availability": float(agg["availability"]),
        "floor_availability": float(agg["floor_availability"]),
        "served_fraction": float(agg["served_fraction"]),
        "below_floor_unit_h": float(agg["below_floor_unit_h"]),
        "cost_vs_guaranteed": float(agg["cost_vs_guaranteed"]),
        "reclaims": float(agg["reclaims"]),
        "launches": float(agg["creates"]),
        "guaranteed_share": float(agg["guaranteed_share"]),
    }


def bound(
    case: FleetCase, offset_s: float, window_s: float, notice_s: float, cycle_s: float = 30.0
) -> dict[str, float]:
    """The LP relaxation of the omniscient schedule for the window (see the module)."""
    from sco.decide.optimal import solve

    sim = Simulation.build(case.spec("sco", offset_s, window_s, notice_s))
    start_s = sim.start_s + sim.spec.warmup_s  # where the runs start counting
    region = SimRegion(sim.traces, sim.spec.sim, start_s=start_s)
    pools = list(region.pools())
    spot = [p for p in pools if p.is_spot]
    g_price = min(p.price_per_h for p in pools if not p.is_spot)
    unit = min(p.units_per_instance for p in pools)
    ticks = math.ceil((sim.end_s - start_s) / cycle_s)
    caps: list[list[int]] = [[] for _ in spot]
    prices: list[list[float]] = [[] for _ in spot]
    targets: list[int] = []
    names = [p.name for p in sim.demand.partitions()]
    for k in range(ticks):
        t = start_s + k * cycle_s
        region.advance_to(t)
        now_prices = region.prices([p.id for p in spot])
        for z, p in enumerate(spot):
            caps[z].append(region.capacity_of(p.id))
            prices[z].append(now_prices[p.id])
        units = sum(sim.demand.demand(n, t).target_units for n in names)
        targets.append(-(-units // unit))
    cold = math.ceil((case.sim.cold_start_s + case.sim.join_s) / cycle_s)
    schedule = solve(caps, targets, cold, cold, cycle_s, prices, g_price, integral=False)
    baseline = sum(targets[cold:]) * g_price * cycle_s / 3600
    spot_h = sum(sum(z[cold:]) for z in schedule.spot)
    g_h = sum(schedule.on_demand[cold:])
    return {
        "availability": 1.0,
        "floor_availability": 1.0,
        "served_fraction": 1.0,
        "below_floor_unit_h": 0.0,
        "cost_vs_guaranteed": schedule.cost / baseline if baseline else 0.0,
        "reclaims": 0.0,
        "launches": 0.0,
        "guaranteed_share": g_h / (spot_h + g_h) if spot_h + g_h else 0.0,
    }


Progress = Callable[[str, int, int], None]


def evaluate_fleet(
    cases: Sequence[FleetCase],
    policies: Sequence[str],
    *,
    windows: int,
    seed: int = 0,
    notice_s: float = 0.0,
    window_s: float = DAY_S,
    workers: Workers = IN_PROCESS,
    progress: Progress | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per scenario and policy, the window means of `KEYS`. Every input is checked
    (policy names, each scenario's traces and demand, windows that fit) before any
    run; raises UnknownPolicy, TraceError, DemandFileError or SimulationInputError."""
    for name in policies:
        if name != "optimal":
            policy_named(name)
    for case in cases:
        Simulation.build(case.spec("sco", 0.0, window_s, notice_s))
    jobs = [
        (case, name, offset, window_s, notice_s)
        for case in cases
        for offset in window_offsets(case, windows, window_s, seed)
        for name in policies
    ]
    done: dict[str, int] = {}
    total = {c.name: sum(1 for j in jobs if j[0] is c) for c in cases}

    def tick(case: FleetCase) -> None:
        done[case.name] = done.get(case.name, 0) + 1
        if progress is not None:
            progress(case.name, done[case.name], total[case.name])

    results = list(sweep(_job, jobs, workers, lambda n, _total: tick(jobs[n - 1][0])))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case in cases:
        out[case.name] = {}
        for name in policies:
            mine = [r for j, r in zip(jobs, results, strict=True) if j[0] is case and j[1] == name]
            out[case.name][name] = {k: statistics.fmean(r[k] for r in mine) for k in KEYS}
    return out


def _job(job: tuple[FleetCase, str, float, float, float]) -> dict[str, float]:
    case, name, offset, window_s, notice_s = job
    return run_window(case, name, offset, window_s, notice_s)


def custom_case(traces: Path, demand: Path, pool_size: int | None, quota: int | None) -> FleetCase:
    """A scenario of any trace set at any scale, with any demand file."""
    return FleetCase(
        traces.name,
        traces,
        demand,
        SimConfig(pool_size=pool_size, guaranteed_quota_per_hall=quota),
    )
