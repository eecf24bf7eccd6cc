"""A batch workload replayed on a simulated region under several policies, on the same
workload, trace and seed, and what the jobs' users felt under each.

The policies are what a user would otherwise pick, run on the same controllers:
- `sco`: sco's placement, the region's reclaim notice drained and requeued in time;
- `sco-no-notice`: the same, with reclaims coming unannounced;
- `spot-requeue`: spot nodes as ParallelCluster runs them: the cheapest spot pool,
  guaranteed only where spot is refused, and a reclaim fails the node (its notice
  is not acted on) and requeues its job;
- `power-save-guaranteed`: guaranteed nodes created when jobs wait and removed when
  idle (Slurm power saving);
- `static-guaranteed` / `static-guaranteed-mean`: a fixed cluster of guaranteed
  nodes sized to the workload's peak (its mean), up from the start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sco.decide.acquirer import ActConfig
from sco.domain.lifecycle import Timeouts
from sco.engine.cycle import ControllerConfig
from sco.lab.region import COLD_START_S, SimConfig
from sco.lab.simulation import Simulation, SimulationInputError, SimulationSpec
from sco.lab.sweep import IN_PROCESS, Workers, sweep
from sco.lab.traces import TraceSet, load_traces, repeated
from sco.lab.workload.kubefile import KubeWorkload, is_kube_workload, peak_nodes, read_kube_workload
from sco.lab.workload.kubeside import KubeSide, kube_spec
from sco.lab.workload.side import BatchSide, FixedDemand, slurm_spec
from sco.lab.workload.swf import Workload, read_swf

PARTITION = "batch"


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    controller: str  # the placement policy its controllers run
    notice: bool = True  # whether reclaims come with the region's notice
    fixed: str | None = None  # "peak" or "mean": a static cluster of that size
    one_pool: bool = False  # sco's job_submit.lua keeps each job of many nodes in one pool


POLICIES = {
    "sco": ReplayPolicy("sco"),
    "sco-no-notice": ReplayPolicy("sco", notice=False, one_pool=True),
    "spot-requeue": ReplayPolicy("cheapest", notice=False),
    "power-save-guaranteed": ReplayPolicy("all-guaranteed"),
    "static-guaranteed": ReplayPolicy("all-guaranteed", fixed="peak"),
    "static-guaranteed-mean": ReplayPolicy("all-guaranteed", fixed="mean"),
}


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    workload: Path
    traces: Path
    days: float | None = None  # the workload's first days (None: all of it)
    pool_size: int | None = None  # instances one trace unit stands for
    notice_s: float = 120.0
    checkpoint_s: float | None = None
    procs_per_node: int | None = None
    max_nodes: int | None = None
    cycle_s: float = 30.0
    floor: int = 0
    seed: int = 0
    requeue_lead: float | None = None  # None: `requeue_lead_s`'s default
    cold_start_s: float = COLD_START_S
    one_pool: bool | None = None  # sco's policies keep jobs in one pool (None: as each says)
    # The controller's lifecycle timeouts, in simulated seconds.
    timeouts: Timeouts = field(default_factory=Timeouts)

    @property
    def requeue_lead_s(self) -> float:
        """A reclaim's jobs are requeued this long before its deadline: by default a
        cycle and 30 s, so that some cycle always falls in time."""
        return self.cycle_s + 30.0 if self.requeue_lead is None else self.requeue_lead


@dataclass
class Replayed:
    """One policy's replay: what its users felt, and what it cost; and for the report,
    each job's wait, the queue and nodes over time, and when work was lost."""

    policy: str
    outcomes: dict[str, float | int | None]
    start_s: float = 0.0
    waits_s: list[float] = field(default_factory=list)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    lost: list[tuple[float, float]] = field(default_factory=list)  # (when, node-seconds)


def load(spec: ReplaySpec) -> tuple[Workload | KubeWorkload, TraceSet]:
    """Check the inputs; raises WorkloadError, TraceError or SimulationInputError."""
    if spec.notice_s < 0:
        raise SimulationInputError(f"--notice-s: must be >= 0, got {spec.notice_s}")
    if spec.cycle_s <= 0:
        raise SimulationInputError(f"--cycle-s: must be > 0, got {spec.cycle_s}")
    if spec.checkpoint_s is not None and spec.checkpoint_s <= 0:
        raise SimulationInputError(f"--checkpoint-s: must be > 0, got {spec.checkpoint_s}")
    if spec.requeue_lead is not None and spec.requeue_lead < 0:
        raise SimulationInputError(f"--requeue-lead-s: must be >= 0, got {spec.requeue_lead}")
    if spec.cold_start_s < 0:
        raise SimulationInputError(f"--cold-start-s: must be >= 0, got {spec.cold_start_s}")
    if spec.pool_size is not None and spec.pool_size < 1:
        raise SimulationInputError(f"--pool-size: must be >= 1, got {spec.pool_size}")
    if is_kube_workload(spec.workload):
        kube = read_kube_workload(spec.workload, spec.days, spec.max_nodes)
        return kube, load_traces(spec.traces)
    workload = read_swf(spec.workload, spec.max_nodes, spec.days, spec.procs_per_node)
    return workload, load_traces(spec.traces)


def replay(
    spec: ReplaySpec,
    policies: Sequence[str],
    progress: Callable[[str, float], None] | None = None,
    workers: Workers = IN_PROCESS,
) -> tuple[Workload | KubeWorkload, list[Replayed], dict[str, Any]]:
    """Each policy's run on the same window, trace and seed, in the order asked:
    in this process (progress in tenths of each run), or side by side on `workers`
    (progress as each run ends)."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SimulationInputError(
            f"--policies: unknown {', '.join(unknown)}; known: {', '.join(POLICIES)}"
        )
    workload, traces = load(spec)
    window_s = window_of(spec, workload)
    trace_days = (traces.end_s - traces.start_s) / 86400
    traces, plays = repeated(traces, traces.start_s + window_s)
    about = {
        "window_days": round(window_s / 86400, 3),
        "trace_days": round(trace_days, 3),
        "trace_plays": plays,  # > 1: the trace was shorter and repeats from its start
        "max_nodes": workload.max_nodes,
        "workload": workload.summary(),
    }
    if isinstance(workload, Workload):
        about["procs_per_node"] = workload.procs_per_node
    if workers.in_process:  # progress within each run, not only as each ends
        runs = []
        for name in policies:

            def step(done: float, name: str = name) -> None:
                if progress is not None:
                    progress(name, done)

            runs.append(_run(spec, name, workload, traces, window_s, step))
        return workload, runs, about
    tasks = [(spec, name, workload, traces, window_s) for name in policies]

    def each(done: int, _total: int) -> None:
        if progress is not None:
            progress(policies[done - 1], 1.0)

    return workload, list(sweep(_run_task, tasks, workers, each)), about


def _run_task(
    task: tuple[ReplaySpec, str, Workload | KubeWorkload, TraceSet, float],
) -> Replayed:
    spec, name, workload, traces, window_s = task
    return _run(spec, name, workload, traces, window_s, lambda _done: None)


def window_of(spec: ReplaySpec, workload: Workload | KubeWorkload) -> float:
    """How long a replay runs: the days asked for, else until the last job submitted
    could have ended by its limit (the last pod by its run, or its service's stop)."""
    if spec.days is not None:
        return spec.days * 86400.0
    if isinstance(workload, KubeWorkload):
        return workload.default_window_s()
    return workload.span_s + max(j.limit_s for j in workload.jobs)


def fixed_size(workload: Workload, window_s: float, which: str) -> int:
    """The nodes the workload keeps busy at its peak (or on average over the window),
    each job run at its submission: what a static cluster is sized to."""
    steps = sorted(
        [(j.submit_s, j.nodes) for j in workload.jobs]
        + [(j.submit_s + j.run_s, -j.nodes) for j in workload.jobs]
    )
    busy = peak = 0
    area = 0.0
    last = 0.0
    for t, delta in steps:
        at = min(t, window_s)
        area += busy * (at - last)
        busy += delta
        peak = max(peak, busy)
        last = at
    size = peak if which == "peak" else math.ceil(area / window_s) if window_s else peak
    return max(1, min(size, workload.max_nodes))


def _run(
    spec: ReplaySpec,
    name: str,
    workload: Workload | KubeWorkload,
    traces: TraceSet,
    window_s: float,
    progress: Callable[[float], None],
) -> Replayed:
    policy = POLICIES[name]
    start = traces.start_s
    end = min(traces.end_s, start + window_s)
    side, fixed = _side(spec, policy, workload, traces, window_s)
    sim_spec = SimulationSpec(
        traces=spec.traces,
        demand=spec.workload,
        policy=policy.controller,
        duration_s=end - start,
        seed=spec.seed,
        cycle_s=spec.cycle_s,
        controller=ControllerConfig(act=ActConfig(timeouts=spec.timeouts)),
        sim=SimConfig(
            notice_s=spec.notice_s if policy.notice else 0.0,
            pool_size=spec.pool_size,
            cold_start_s=spec.cold_start_s,
            guaranteed_quota_per_hall=workload.max_nodes,
            seed=spec.seed,
        ),
    )
    sim = Simulation(sim_spec, traces, side.demand, sim_spec.new_policy(), start, end, side)
    result = sim.run(progress=progress)
    waits = side.waits(end)
    outcomes: dict[str, float | int | None] = dict(side.outcomes(start, end, waits))
    totals = result.aggregate()
    outcomes.update(
        cost=round(float(totals["cost"]), 2),
        cost_vs_guaranteed=round(float(totals["cost_vs_guaranteed"]), 4),
        reclaims=int(totals["reclaims"]),
        guaranteed_share=round(float(totals["guaranteed_share"]), 4),
        fixed_nodes=fixed,
        wall_s=round(result.wall_s, 2),
    )
    return Replayed(name, outcomes, start, waits, side.samples, side.cluster.lost)


def widest_pool(spec: ReplaySpec, traces: TraceSet) -> int:
    """The most instances one spot pool of the trace ever holds: a job wider than that
    is left free to span pools (`one_pool_max_nodes`), as an operator would set it."""
    most = 1
    for s in traces.series:
        top = max(s.values, default=0)
        size = spec.pool_size or (traces.region.pool_size if s.binary else 1)
        most = max(most, top * size)
    return most


def _one_pool(spec: ReplaySpec, policy: ReplayPolicy) -> bool:
    """Whether the queue keeps each job of many nodes in one pool under `policy`: sco's
    own choice (`--one-pool`/`--spread`) for its policies, else as the policy says."""
    if spec.one_pool is not None and policy.controller == "sco":
        return spec.one_pool
    return policy.one_pool


def _side(
    spec: ReplaySpec,
    policy: ReplayPolicy,
    workload: Workload | KubeWorkload,
    traces: TraceSet,
    window_s: float,
) -> tuple[BatchSide | KubeSide, int | None]:
    """The scheduler side of one policy's run, and the static cluster's size if any."""
    region = traces.region.name or traces.folder.name
    start = traces.start_s
    if isinstance(workload, KubeWorkload):
        kspec = kube_spec(PARTITION, region, workload, spec.floor)
        size = None if policy.fixed is None else peak_nodes(workload, window_s, policy.fixed)
        fixed = None if size is None else FixedDemand(kspec.partition, min(size, kspec.max_units))
        side = KubeSide(workload, kspec, start, spec.requeue_lead_s, spec.checkpoint_s, fixed)
        return side, None if fixed is None else fixed.nodes
    demand_spec = slurm_spec(
        PARTITION, region, workload.procs_per_node, workload.max_nodes,
        spec.requeue_lead_s, spec.floor, _one_pool(spec, policy), widest_pool(spec, traces),
    )  # fmt: skip
    size = None if policy.fixed is None else fixed_size(workload, window_s, policy.fixed)
    return BatchSide(workload, demand_spec, start, spec.checkpoint_s, size), size
