"""A batch queue as the scheduler side of a simulation (`SchedulerSide`): jobs arrive
at their submission times, run on the nodes of servers sco's controllers create
in the simulated region, and lose their nodes with those servers.

The demand is read from the queue by sco's own Slurm intake (`SlurmDemandSource`
over a `SlurmView` of the lab's cluster), and the controllers' node plane is
sco's own `SlurmNodes`: drains, requeues before a reclaim's deadline, nodes
taken down and deleted, exactly as on slurmctld. Or, for a fixed cluster, the
demand is a constant number of nodes (`fixed_nodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
from sco.adapters.slurm.nodes import (
    SlurmNodes,
    SlurmPartition,
    SlurmView,
    node_features,
    node_name,
    pool_feature,
)
from sco.decide.binpack import Size
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.engine.clock import ManualClock
from sco.lab.region import SimRegion
from sco.lab.workload.cluster import BatchCluster, QueuedJob
from sco.lab.workload.outcomes import bounded_slowdown, pct, rounded
from sco.lab.workload.swf import Workload
from sco.ports import DemandSource, SchedulerCluster, ServerView

SLURM_PARTITION = "batch"
SAMPLE_S = 600.0  # how often the queue and the nodes are sampled for the report


class FixedDemand:
    """A partition that wants `nodes` guaranteed nodes, always (a static cluster)."""

    def __init__(self, partition: Partition, nodes: int) -> None:
        self.partition = partition
        self.nodes = nodes

    def partitions(self) -> Sequence[Partition]:
        return [self.partition]

    def demand(self, partition: str, now: float) -> Demand:  # noqa: ARG002
        n = self.nodes
        return Demand(n, n, n, n, guaranteed_units=n)

    def next_change_after(self, now: float) -> float | None:  # noqa: ARG002
        return None


class LabCluster(Protocol):
    """What a replay's side needs of the lab's cluster, whichever its scheduler."""

    def submit(self, work: Any) -> None: ...

    def next_event_time(self) -> float | None: ...

    def step(self) -> bool: ...

    def server_gone(self, name: str) -> None: ...


class Roster(Protocol):
    """What a replay's side does by its scheduler's ways as nodes come: how a joined
    server's node registers, and what the report samples of the queue and nodes."""

    def join(self, server: ServerView, capacity_class: str) -> str:
        """Register the server's node; returns its name."""
        ...

    def counts(self) -> tuple[int, int, int]:
        """(pending, nodes up, nodes busy) now."""
        ...


class RegionLink:
    """The region and the clock a replay's side works on, once attached; before that,
    time stands at `start_s` and the region lists nothing."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.region: SimRegion | None = None
        self._clock: ManualClock | None = None
        self.spot: dict[str, bool] = {}  # pool id -> spot (the region's pools, at attach)

    def attach(self, region: SimRegion, clock: ManualClock) -> None:
        self.region, self._clock = region, clock
        self.spot = {p.id: p.is_spot for p in region.pools()}

    def now(self) -> float:
        return self._clock.now() if self._clock is not None else self.start_s

    def listing(self, partition: str) -> Sequence[ServerView]:
        return self.region.list(partition) if self.region is not None else ()


class WorkloadFeed:
    """What a replay's scheduler side does whatever the scheduler: work arrives at its
    times, nodes register (by `roster`) when their servers join and go with them, and
    the queue and nodes are sampled for the report."""

    def __init__(self, partition: str, work: Sequence[Any], arrivals: Sequence[float],
                 link: RegionLink, cluster: LabCluster, roster: Roster) -> None:  # fmt: skip
        self.partition_name = partition
        self.work = work
        self.arrivals = arrivals  # each piece of work's, from the start, in order
        self.start_s = link.start_s
        self._link = link
        self._cluster = cluster
        self._roster = roster
        self._next = 0  # the next piece of work to submit
        # (when, pending, nodes up, nodes busy) every `SAMPLE_S`, for the report
        self.samples: list[tuple[float, int, int, int]] = []
        self._next_sample = self.start_s
        self._registered: dict[str, str] = {}  # server id -> its node, once registered
        self._server_events = -1

    def next_event_time(self) -> float | None:
        times = [self._cluster.next_event_time()]
        if self._next < len(self.arrivals):
            times.append(self.start_s + self.arrivals[self._next])
        return min((t for t in times if t is not None), default=None)

    def advance(self, t: float) -> bool:
        moved = False
        while self._next < len(self.arrivals) and self.start_s + self.arrivals[self._next] <= t:
            self._cluster.submit(self.work[self._next])
            self._next += 1
            moved = True
        moved = self._nodes() or moved
        moved = self._cluster.step() or moved
        if t >= self._next_sample:
            self.samples.append((t, *self._roster.counts()))
            self._next_sample = t + SAMPLE_S
        return moved

    def _nodes(self) -> bool:
        """Nodes register when their servers join, and go with their servers."""
        region = self._link.region
        assert region is not None
        name = self.partition_name
        events = region.server_events.get(name, 0)
        if events == self._server_events:
            return False
        self._server_events = events
        servers = {v.server_id: v for v in region.list(name)}
        views = region.nodes(name)
        spot = self._link.spot
        for sid, node in views.items():
            server = servers.get(sid)
            if node.joined and sid not in self._registered and server is not None:
                cls = "spot" if spot.get(server.pool, False) else "guaranteed"
                self._registered[sid] = self._roster.join(server, cls)
        for sid in [s for s in self._registered if s not in views]:
            self._cluster.server_gone(self._registered.pop(sid))
        return True


class SlurmRoster:
    """A batch queue's nodes: slurmd registers a node by its server, with the features
    its server boots it with."""

    def __init__(self, cluster: BatchCluster, spec: SlurmDemandSpec) -> None:
        self.cluster = cluster
        self.spec = spec

    def join(self, server: ServerView, capacity_class: str) -> str:
        slurm = self.spec.slurm
        partition = self.spec.partition.name
        features = node_features(partition, capacity_class, server.pool, slurm.installation)
        name = node_name(server.server_id)
        self.cluster.register(name, frozenset(features))
        return name

    def counts(self) -> tuple[int, int, int]:
        c = self.cluster
        pending = sum(q.state == "PENDING" for q in c.live.values())
        up = [n for n in c.nodes_by_name.values() if n.state != "down"]
        return pending, len(up), sum(n.state == "allocated" for n in up)


class BatchSide:
    """The queue, its cluster and its node plane, on the simulation's clock."""

    def __init__(
        self,
        workload: Workload,
        spec: SlurmDemandSpec,
        start_s: float,
        checkpoint_s: float | None = None,
        fixed_nodes: int | None = None,
    ) -> None:
        jobs = workload.jobs
        self.workload = workload
        self.spec = spec
        self.link = RegionLink(start_s)
        self.cluster = BatchCluster(
            spec.partition.name,
            spec.slurm.shape,
            self.link.now,
            spec.slurm.feature,
            SLURM_PARTITION,
            checkpoint_s,
        )
        self.feed = WorkloadFeed(
            spec.partition.name,
            jobs,
            [j.submit_s for j in jobs],
            self.link,
            self.cluster,
            SlurmRoster(self.cluster, spec),
        )
        self.view = SlurmView(self.cluster, [SLURM_PARTITION], ttl_s=0.0)  # type: ignore[arg-type]
        self.demand: DemandSource = (
            SlurmDemandSource(self.view, [spec], self.link.listing)
            if fixed_nodes is None
            else FixedDemand(spec.partition, fixed_nodes)
        )

    @property
    def samples(self) -> list[tuple[float, int, int, int]]:
        """(when, pending, nodes up, nodes busy), every `SAMPLE_S`."""
        return self.feed.samples

    # ------------------------------------------------------------ SchedulerSide

    def attach(self, region: SimRegion, clock: ManualClock) -> SchedulerCluster:
        self.link.attach(region, clock)
        self.cluster.topology = {pool_feature(p.id): p.hall for p in region.pools()}
        if self.spec.one_pool:  # sco's job_submit.lua, the region's pools in its order
            self.cluster.pool_order = [pool_feature(p.id) for p in region.pools()]
            self.cluster.pool_widest = self.spec.one_pool_max_nodes
        slurm = {self.spec.partition.name: self.spec.slurm}
        return SlurmNodes(self.view, slurm, self.link.listing, clock)

    def next_event_time(self) -> float | None:
        return self.feed.next_event_time()

    def advance(self, t: float) -> bool:
        return self.feed.advance(t)

    # ------------------------------------------------------------ what users felt

    def waits(self, end: float) -> list[float]:
        """Each job's time pending by `end` (every wait, requeues' too), in order."""
        return sorted(
            q.waited_s + (end - q.pending_since if q.state == "PENDING" else 0.0)
            for q in self.cluster.jobs_by_id.values()
        )

    def outcomes(self, start: float, end: float, waits: list[float]) -> dict[str, float | None]:
        """From the queue's ledger at `end` (`waits`: `waits(end)`)."""
        jobs = list(self.cluster.jobs_by_id.values())
        done = [q for q in jobs if q.state == "COMPLETED" and q.ended_at is not None]
        took = [((q.ended_at or end) - start - q.job.submit_s, q.job.run_s) for q in done]
        restarts = sorted(self.cluster.restart_waits)
        return {
            "jobs_submitted": len(jobs),
            "jobs_completed": len(done),
            "jobs_failed": sum(q.state == "FAILED" for q in jobs),
            "jobs_unfinished": sum(q.state in ("PENDING", "RUNNING") for q in jobs),
            "wait_p50_s": pct(waits, 0.50),
            "wait_p95_s": pct(waits, 0.95),
            "wait_p99_s": pct(waits, 0.99),
            "bounded_slowdown": bounded_slowdown(took),
            "requeues": sum(q.requeues for q in jobs),
            "restart_wait_p50_s": pct(restarts, 0.50),
            "restart_wait_p95_s": pct(restarts, 0.95),
            "lost_node_hours": round(sum(q.lost_node_s for q in jobs) / 3600.0, 3),
            "work_node_hours": round(sum(q.job.run_s * q.job.nodes for q in done) / 3600.0, 3),
            "utilisation": rounded(self.cluster.utilisation(end), 4),
            **exposure(jobs),
        }


def exposure(jobs: Sequence[QueuedJob]) -> dict[str, float | None]:
    """What reclaims could reach: of the jobs of many nodes that ran, the share whose
    nodes spanned more than one pool in some run, and the pools a run spanned on
    average (the most of each job's runs); of all jobs, the share that met a reclaim."""
    wide = [q for q in jobs if q.job.nodes > 1 and q.pools_spanned]
    ran = [q for q in jobs if q.pools_spanned]
    return {
        "wide_jobs_multi_pool": rounded(
            sum(q.pools_spanned > 1 for q in wide) / len(wide) if wide else None, 4
        ),
        "wide_job_pools_mean": rounded(
            sum(q.pools_spanned for q in wide) / len(wide) if wide else None, 3
        ),
        "jobs_met_reclaim": rounded(
            sum(q.reclaims_met > 0 for q in ran) / len(ran) if ran else None, 4
        ),
    }


def slurm_spec(
    partition: str,
    region: str,
    shape_cpus: int,
    max_nodes: int,
    requeue_lead_s: float,
    floor: int = 0,
    one_pool: bool = False,
    one_pool_max_nodes: int | None = None,
) -> SlurmDemandSpec:
    """One sco partition over the queue's Slurm partition, of at most `max_nodes`."""
    slurm = SlurmPartition(
        partition,
        (SLURM_PARTITION,),
        Size(shape_cpus, 1024 * shape_cpus),
        requeue_lead_s=requeue_lead_s,
    )
    return SlurmDemandSpec(
        Partition(partition, region, SchedulerKind.SLURM), slurm, floor, max_nodes, max_nodes,
        one_pool=one_pool, one_pool_max_nodes=one_pool_max_nodes,
    )  # fmt: skip
