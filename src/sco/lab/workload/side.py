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

from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
from sco.adapters.slurm.nodes import SlurmNodes, SlurmPartition, SlurmView, node_features, node_name
from sco.decide.binpack import Size
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.engine.clock import ManualClock
from sco.lab.region import SimRegion
from sco.lab.workload.cluster import BatchCluster
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
        self.workload = workload
        self.spec = spec
        self.start_s = start_s
        self._clock: ManualClock | None = None
        self._region: SimRegion | None = None
        self.cluster = BatchCluster(
            spec.partition.name,
            spec.slurm.shape,
            self._now,
            spec.slurm.feature,
            SLURM_PARTITION,
            checkpoint_s,
        )
        self.view = SlurmView(self.cluster, [SLURM_PARTITION], ttl_s=0.0)  # type: ignore[arg-type]
        self.demand: DemandSource = (
            SlurmDemandSource(self.view, [spec], self._listing)
            if fixed_nodes is None
            else FixedDemand(spec.partition, fixed_nodes)
        )
        self._next = 0  # the next job of the workload to submit
        # (when, jobs pending, nodes up, nodes busy) every `SAMPLE_S`, for the report
        self.samples: list[tuple[float, int, int, int]] = []
        self._next_sample = start_s
        self._registered: set[str] = set()  # server ids whose nodes registered
        self._server_events = -1
        self._spot: dict[str, bool] = {}  # pool id -> spot (the region's pools, at attach)

    def _now(self) -> float:
        return self._clock.now() if self._clock is not None else self.start_s

    def _listing(self, partition: str) -> Sequence[ServerView]:
        return self._region.list(partition) if self._region is not None else ()

    # ------------------------------------------------------------ SchedulerSide

    def attach(self, region: SimRegion, clock: ManualClock) -> SchedulerCluster:
        self._region, self._clock = region, clock
        self._spot = {p.id: p.is_spot for p in region.pools()}
        slurm = {self.spec.partition.name: self.spec.slurm}
        return SlurmNodes(self.view, slurm, self._listing, clock)

    def next_event_time(self) -> float | None:
        times = [self.cluster.next_event_time()]
        if self._next < len(self.workload.jobs):
            times.append(self.start_s + self.workload.jobs[self._next].submit_s)
        return min((t for t in times if t is not None), default=None)

    def advance(self, t: float) -> bool:
        jobs = self.workload.jobs
        moved = False
        while self._next < len(jobs) and self.start_s + jobs[self._next].submit_s <= t:
            self.cluster.submit(jobs[self._next])
            self._next += 1
            moved = True
        moved = self._nodes() or moved
        moved = self.cluster.step() or moved
        if t >= self._next_sample:
            self._sample(t)
        return moved

    def _sample(self, t: float) -> None:
        c = self.cluster
        pending = sum(q.state == "PENDING" for q in c.live.values())
        up = [n for n in c.nodes_by_name.values() if n.state != "down"]
        busy = sum(n.state == "allocated" for n in up)
        self.samples.append((t, pending, len(up), busy))
        self._next_sample = t + SAMPLE_S

    def _nodes(self) -> bool:
        """Nodes register when their servers' slurmd joins, and go with their servers."""
        region = self._region
        assert region is not None
        name = self.spec.partition.name
        events = region.server_events.get(name, 0)
        if events == self._server_events:
            return False
        self._server_events = events
        servers = {v.server_id: v for v in region.list(name)}
        views = region.nodes(name)
        for sid, node in views.items():
            server = servers.get(sid)
            if node.joined and sid not in self._registered and server is not None:
                cls = "spot" if self._spot.get(server.pool, False) else "guaranteed"
                features = node_features(name, cls, server.pool, self.spec.slurm.installation)
                self.cluster.register(node_name(sid), frozenset(features))
                self._registered.add(sid)
        for sid in [s for s in self._registered if s not in views]:
            self.cluster.server_gone(node_name(sid))
            self._registered.discard(sid)
        return True


def slurm_spec(
    partition: str,
    region: str,
    shape_cpus: int,
    max_nodes: int,
    requeue_lead_s: float,
    floor: int = 0,
) -> SlurmDemandSpec:
    """One sco partition over the queue's Slurm partition, of at most `max_nodes`."""
    slurm = SlurmPartition(
        partition,
        (SLURM_PARTITION,),
        Size(shape_cpus, 1024 * shape_cpus),
        requeue_lead_s=requeue_lead_s,
    )
    return SlurmDemandSpec(
        Partition(partition, region, SchedulerKind.SLURM), slurm, floor, max_nodes, max_nodes
    )
