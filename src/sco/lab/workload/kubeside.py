"""A Kubernetes cluster as the scheduler side of a simulation (`SchedulerSide`): pods
arrive at their start times, run on the nodes of servers sco's controllers create
in the simulated region, and lose their nodes with those servers.

The demand is read from the pods and nodes by sco's own Kubernetes intake
(`KubernetesDemandSource`), and the controllers' node plane is sco's own
`KubernetesNodes`: labels, cordons, evictions, deletes at a reclaim's deadline,
Nodes deleted, exactly as against an API server.
"""

from __future__ import annotations

from collections.abc import Sequence

from sco.adapters.kubernetes.demand import KubeDemandSpec, KubePartition, KubernetesDemandSource
from sco.adapters.kubernetes.nodes import KubernetesNodes
from sco.adapters.kubernetes.pods import CLASS_LABEL, PARTITION_LABEL
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.engine.clock import ManualClock
from sco.lab.region import SimRegion
from sco.lab.workload.kubecluster import KubeCluster, PodLedger
from sco.lab.workload.kubefile import KubeWorkload
from sco.lab.workload.outcomes import bounded_slowdown, pct, rounded
from sco.lab.workload.side import RegionLink, WorkloadFeed
from sco.ports import DemandSource, SchedulerCluster, ServerView


class _Attached:
    """The intake, made when the side attaches to its region (it needs the pools)."""

    def __init__(self, spec: KubeDemandSpec) -> None:
        self.spec = spec
        self.partition = spec.partition
        self.source: KubernetesDemandSource | None = None

    def partitions(self) -> Sequence[Partition]:
        return [self.partition]

    def demand(self, partition: str, now: float) -> Demand:
        if self.source is None:  # not attached: no pod has come yet
            s = self.spec
            floor = min(s.floor_units, s.max_units)
            return Demand(0, floor, s.max_units, s.guaranteed_budget_units)
        return self.source.demand(partition, now)

    def next_change_after(self, now: float) -> float | None:  # noqa: ARG002
        return None


class KubeRoster:
    """A Kubernetes cluster's nodes: the kubelet registers a Node named by its server,
    labelled with its capacity class."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster

    def join(self, server: ServerView, capacity_class: str) -> str:
        name = f"node-{server.server_id}"
        self.cluster.register(name, server.server_id, {CLASS_LABEL: capacity_class})
        return name

    def counts(self) -> tuple[int, int, int]:
        c = self.cluster
        pending = sum(not p["spec"].get("nodeName") for p in c.pods.values())
        up = [n for n, node in c.nodes_by_name.items() if _ready(node)]
        running = {p["spec"].get("nodeName") for p in c.pods.values()}
        return pending, len(up), sum(n in running for n in up)


class KubeSide:
    """The cluster, its pods' controllers and its node plane, on the simulation's clock."""

    def __init__(
        self,
        workload: KubeWorkload,
        spec: KubeDemandSpec,
        start_s: float,
        grace_s: float,
        checkpoint_s: float | None = None,
        fixed: DemandSource | None = None,
    ) -> None:
        pods = workload.pods
        self.workload = workload
        self.spec = spec
        self.grace_s = grace_s
        self.link = RegionLink(start_s)
        self.cluster = KubeCluster(
            dict(spec.kube.labels),
            dict(spec.kube.allocatable),
            self.link.now,
            checkpoint_s,
            start_s,
        )
        self.feed = WorkloadFeed(
            spec.partition.name,
            pods,
            [p.start_s for p in pods],
            self.link,
            self.cluster,
            KubeRoster(self.cluster),
        )
        self._intake = _Attached(spec)
        self.demand: DemandSource = fixed or self._intake

    @property
    def samples(self) -> list[tuple[float, int, int, int]]:
        """(when, pending, nodes up, nodes busy), every `SAMPLE_S`."""
        return self.feed.samples

    # ------------------------------------------------------------ SchedulerSide

    def attach(self, region: SimRegion, clock: ManualClock) -> SchedulerCluster:
        self.link.attach(region, clock)
        pools = list(region.pools())
        c = self.cluster
        self._intake.source = KubernetesDemandSource(
            c.pod_informer,  # type: ignore[arg-type]
            c.node_informer,  # type: ignore[arg-type]
            [self.spec],
            listing=self.link.listing,
            pools=pools,
        )
        return KubernetesNodes(
            c,
            c.node_informer,  # type: ignore[arg-type]
            c.pod_informer,  # type: ignore[arg-type]
            clock,
            self.grace_s,
            {self.spec.partition.name: self.spec.kube},
            self.link.listing,
            pools,
        )

    def next_event_time(self) -> float | None:
        return self.feed.next_event_time()

    def advance(self, t: float) -> bool:
        return self.feed.advance(t)

    # ------------------------------------------------------------ what users felt

    def waits(self, end: float) -> list[float]:
        """Each job pod's time pending by `end` (every wait, restarts' too), in order."""
        return sorted(
            x.waited_s + (end - x.pending_since if x.state == "Pending" else 0.0)
            for x in self.cluster.ledger.values()
            if x.work.is_job
        )

    def outcomes(self, start: float, end: float, waits: list[float]) -> dict[str, float | None]:
        c = self.cluster
        jobs = [x for x in c.ledger.values() if x.work.is_job]
        done = [x for x in jobs if x.state == "Succeeded" and x.ended_at is not None]
        replicas = [x for x in c.ledger.values() if not x.work.is_job]
        wanted = sum(_wanted_s(x.work.start_s, x.work.stop_s, start, end) for x in replicas)
        ran = sum(x.ran_s + _running_s(x, end) for x in replicas)
        took = [((x.ended_at or end) - start - x.work.start_s, x.work.run_s or 0.0) for x in done]
        return {
            "jobs_submitted": len(jobs),
            "jobs_completed": len(done),
            "jobs_failed": 0,  # a pod's controller always makes another
            "jobs_unfinished": len(jobs) - len(done),
            "wait_p50_s": pct(waits, 0.50),
            "wait_p95_s": pct(waits, 0.95),
            "wait_p99_s": pct(waits, 0.99),
            "bounded_slowdown": bounded_slowdown(took),
            "requeues": sum(x.restarts for x in jobs),
            "lost_node_hours": round(sum(t[1] for t in c.lost) / 3600.0, 3),
            "lost_pod_hours": round(sum(x.lost_s for x in jobs) / 3600.0, 3),
            "service_replicas": len(replicas),
            "service_disruptions": sum(x.restarts for x in replicas),
            "service_unavailable_share": round(1.0 - ran / wanted, 4) if wanted else None,
            "utilisation": rounded(c.utilisation(end), 4),
        }


def _wanted_s(start_s: float, stop_s: float | None, start: float, end: float) -> float:
    """How long a replica was wanted within the replay (times from its `start`)."""
    stop = end if stop_s is None else min(end, start + stop_s)
    return max(0.0, stop - start - start_s)


def _running_s(x: PodLedger, end: float) -> float:
    return end - x.started_at if x.state == "Running" and x.started_at is not None else 0.0


def _ready(node: dict[str, object]) -> bool:
    status = node.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def kube_spec(
    partition: str, region: str, workload: KubeWorkload, floor: int = 0
) -> KubeDemandSpec:
    """One sco partition over the cluster's nodes, of at most the workload's max."""
    kube = KubePartition({PARTITION_LABEL: partition}, dict(workload.node))
    n = workload.max_nodes
    return KubeDemandSpec(Partition(partition, region, SchedulerKind.KUBERNETES), kube, floor, n, n)
