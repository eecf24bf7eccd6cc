"""From `sco.yaml` to the scheduler side: each partition's demand and node plane
(static, Slurm, Kubernetes, or servers whose agents report), checked at start so a
command exits 2 naming what it cannot reach."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sco.assembly.sections import KubernetesClusterSettings
from sco.assembly.settings import PartitionSettings, Settings
from sco.assembly.wiring import StartError, demand
from sco.domain.demand import Partition, SchedulerKind
from sco.domain.pools import Pool
from sco.ports import (
    AckReader,
    Clock,
    DemandSource,
    SchedulerCluster,
    ServerView,
)

if TYPE_CHECKING:  # an extra: imported when a partition uses it
    from sco.adapters.kubernetes.demand import KubePartition


@dataclass
class SchedulerPlane:
    """Every partition's demand, and its node plane, as the configuration says;
    `close` stops what watches a scheduler (Kubernetes informers)."""

    demand: DemandSource
    nodes: SchedulerCluster
    close: Callable[[], None] = lambda: None


def scheduler_plane(
    settings: Settings,
    region: str,
    start_s: float,
    listing: Callable[[str], Sequence[ServerView]],
    clock: Clock,
    acks: AckReader | None = None,
    pools: Sequence[Pool] = (),
    read_only: bool = False,
) -> SchedulerPlane:
    """Static partitions keep servers as nodes (drained when asked, or when their agent
    says so with `agents: true` and `acks`); Slurm partitions get their cluster's demand
    and nodes (checked at start: reachable, partitions known, output readable), and
    Kubernetes partitions theirs (checked at start: the kubeconfig loads, the API
    server answers and lets sco list nodes and pods). `pools` are the provider's: a
    Kubernetes node is labelled with its pool's class. `read_only` (a dry run): the
    intake writes nothing to a cluster either (no Warning Event on a pod)."""
    from sco.adapters.standalone import AgentNodes, ServersAsNodes
    from sco.engine.routing import DemandRouter, NodeRouter

    static = demand(settings, region, start_s)
    sources: list[DemandSource] = [static]
    planes: dict[str, SchedulerCluster] = {}
    slurm = [p for p in settings.partitions if p.demand == "slurm"]
    if slurm:
        for source, plane, names in _slurm(settings, slurm, region, listing, clock):
            sources.append(source)
            planes.update(dict.fromkeys(names, plane))
    closers: list[Callable[[], None]] = []
    kube = [p for p in settings.partitions if p.demand == "kubernetes"]
    if kube:
        for source, plane, names, close in _kubernetes(
            settings, kube, region, listing, clock, pools, read_only
        ):
            sources.append(source)
            planes.update(dict.fromkeys(names, plane))
            closers.append(close)
    if acks is not None:
        agents = AgentNodes(listing, acks)
        planes.update(
            {p.name: agents for p in settings.partitions if p.agents and p.name not in planes}
        )
    order = [p.name for p in settings.partitions]
    return SchedulerPlane(
        DemandRouter(sources, order),
        NodeRouter(planes, ServersAsNodes(listing)),
        lambda: _close_all(closers),
    )


def _close_all(closers: Sequence[Callable[[], None]]) -> None:
    for close in closers:
        close()


def _slurm(
    settings: Settings,
    specs: Sequence[PartitionSettings],
    region: str,
    listing: Callable[[str], Sequence[ServerView]],
    clock: Clock,
) -> list[tuple[DemandSource, SchedulerCluster, list[str]]]:
    from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
    from sco.adapters.slurm.nodes import SlurmNodes, SlurmPartition, SlurmView
    from sco.adapters.slurm.tools import ClusterTools, SlurmError, SlurmTools
    from sco.decide.binpack import Size

    out: list[tuple[DemandSource, SchedulerCluster, list[str]]] = []
    by_cluster: dict[str, list[PartitionSettings]] = {}
    for p in specs:
        assert p.slurm is not None
        by_cluster.setdefault(p.slurm.cluster, []).append(p)
    for name, members in sorted(by_cluster.items()):
        c = settings.slurm_cluster(name)
        tools = SlurmTools(ClusterTools(name, c.conf, c.bin_dir, c.timeout_s))
        wanted = sorted({sp for p in members for sp in (p.slurm.partitions if p.slurm else [])})
        try:
            known = tools.partitions()
            tools.nodes()
            tools.jobs(wanted)
        except SlurmError as e:
            raise StartError(f"slurm.{name}: {e}") from None
        except Exception as e:  # output that cannot be read
            raise StartError(f"slurm.{name}: {type(e).__name__}: {e}") from None
        for p in members:
            assert p.slurm is not None
            missing = sorted(set(p.slurm.partitions) - known)
            if missing:
                raise StartError(
                    f"partitions.{p.name}.slurm.partitions: {', '.join(missing)} not in Slurm "
                    f"cluster {name!r} (it has {', '.join(sorted(known)) or 'none'})"
                )
        view = SlurmView(tools, wanted, c.cache_s)
        parts = {}
        demand_specs = []
        for p in members:
            assert p.slurm is not None
            s = p.slurm
            parts[p.name] = SlurmPartition(
                p.name,
                tuple(s.partitions),
                Size(s.cpus, s.memory_mb, dict(s.gres)),
                s.requeue_lead_s,
                s.idle_keep_s,
                settings.installation,
            )
            partition, floor, budget, target = _scheduler_figures(p, region)
            demand_specs.append(
                SlurmDemandSpec(
                    partition,
                    parts[p.name],
                    floor,
                    p.max_units,
                    budget,
                    target,
                    one_pool=s.one_pool,
                    one_pool_max_nodes=s.one_pool_max_nodes,
                )
            )
        out.append(
            (
                SlurmDemandSource(view, demand_specs, listing),
                SlurmNodes(view, parts, listing, clock),
                [p.name for p in members],
            )
        )
    return out


def _kubernetes(
    settings: Settings,
    specs: Sequence[PartitionSettings],
    region: str,
    listing: Callable[[str], Sequence[ServerView]],
    clock: Clock,
    pools: Sequence[Pool],
    read_only: bool,
) -> list[tuple[DemandSource, SchedulerCluster, list[str], Callable[[], None]]]:
    try:
        from sco.adapters.kubernetes.demand import KubeDemandSpec, KubernetesDemandSource
        from sco.adapters.kubernetes.informer import Informer
        from sco.adapters.kubernetes.nodes import KubernetesNodes
    except ModuleNotFoundError:
        raise StartError("demand kubernetes: pip install 'sco[kubernetes]'") from None

    out: list[tuple[DemandSource, SchedulerCluster, list[str], Callable[[], None]]] = []
    by_cluster: dict[str, list[PartitionSettings]] = {}
    for p in specs:
        assert p.kubernetes is not None
        by_cluster.setdefault(p.kubernetes.cluster, []).append(p)
    for name, members in sorted(by_cluster.items()):
        parts = {p.name: _kube_partition(p, settings.installation) for p in members}
        _no_shared_nodes(name, parts)
        c = settings.kubernetes_cluster(name)
        core = _kube_client(name, c)
        demand_specs = []
        for p in members:
            partition, floor, budget, target = _scheduler_figures(p, region)
            demand_specs.append(
                KubeDemandSpec(
                    partition,
                    parts[p.name],
                    floor,
                    p.max_units,
                    budget,
                    min_target_units=target,
                )
            )
        nodes, pods = (
            Informer(
                call,
                name=f"{name}-{what}",
                watch_timeout_s=c.watch_timeout_s,
                request_timeout_s=c.timeout_s,
            ).start()
            for call, what in (
                (core.list_node, "nodes"),
                (core.list_pod_for_all_namespaces, "pods"),
            )
        )
        # The first cycle finds them listed, unless the cluster is slow to answer:
        # then its partitions wait, degraded, for the informers.
        nodes.wait_synced(c.timeout_s)
        pods.wait_synced(c.timeout_s)

        events = None if read_only else core  # a dry run tells no pod anything

        def close(watching: tuple[Informer, ...] = (nodes, pods)) -> None:
            for informer in watching:
                informer.stop()

        out.append(
            (
                KubernetesDemandSource(
                    pods, nodes, demand_specs, events, c.timeout_s, listing, pools
                ),
                KubernetesNodes(core, nodes, pods, clock, c.grace_s, parts, listing, pools),
                [p.name for p in members],
                close,
            )
        )
    return out


def _scheduler_figures(p: PartitionSettings, region: str) -> tuple[Partition, int, int, int]:
    """A scheduler-driven partition's domain Partition and its fixed figures: floor,
    guaranteed budget (default: its max) and the target it never goes below (the
    settings make floor and target numbers for such partitions)."""

    floor = p.floor_units if isinstance(p.floor_units, int) else 0
    target = p.target_units if isinstance(p.target_units, int) else 0
    budget = p.max_units if p.guaranteed_budget_units is None else p.guaranteed_budget_units
    partition = Partition(p.name, region, SchedulerKind(p.kind), frozenset(p.flavors))
    return partition, floor, budget, target


def _kube_client(name: str, c: KubernetesClusterSettings) -> Any:
    """A `CoreV1Api` for the cluster, once it has answered a list of nodes and of pods."""
    from sco.adapters.kubernetes.connect import ConnectError, connect

    try:
        return connect(
            in_cluster=c.in_cluster, kubeconfig=c.kubeconfig, context=c.context,
            timeout_s=c.timeout_s,
        )  # fmt: skip
    except ConnectError as e:
        where = f"kubernetes.{name}" + (f".{e.field}" if e.field else "")
        raise StartError(f"{where}: {e.why}") from None


def _kube_partition(p: PartitionSettings, installation: str) -> KubePartition:
    """The partition's labels default to `sco.io/partition=<name>`; a named
    installation's nodes also carry `sco.io/installation=<name>`, beside its own
    labels or the default: a node is a partition's only when it is of its
    installation too, so another sco's nodes in the cluster are never its own."""
    from sco.adapters.kubernetes.demand import KubePartition
    from sco.adapters.kubernetes.nodes import label_value
    from sco.adapters.kubernetes.pods import PARTITION_LABEL

    k = p.kubernetes
    assert k is not None
    part = KubePartition(
        labels=dict(k.labels) or {PARTITION_LABEL: label_value(p.name)},
        allocatable=dict(k.allocatable),
        spot_taint=k.spot_taint,
        daemonset_overhead=dict(k.daemonset_overhead),
        installation=installation,
    )
    try:
        part.shape()
    except ValueError as e:  # a quantity the API would not accept either
        raise StartError(f"partitions.{p.name}.kubernetes: {_one_line(e)}") from None
    return part


def _no_shared_nodes(cluster: str, parts: Mapping[str, KubePartition]) -> None:
    """Two partitions of one cluster whose labels one node could carry both would
    count, label and delete each other's nodes: refused."""
    names = sorted(parts)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if parts[a].overlaps(parts[b]):
                raise StartError(
                    f"partitions.{a}.kubernetes.labels and partitions.{b}.kubernetes.labels "
                    f"(cluster {cluster!r}): one node could carry both; give them a label "
                    "with different values (the default, sco.io/partition=<name>, does)"
                )


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
