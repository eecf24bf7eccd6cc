"""From `sco.yaml` to adapters: the one place each store, log and client is opened.

Each opener turns what cannot be reached into `StartError` with one line
naming the setting, so a command exits 2 before doing anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import OperationalError

from sco.adapters.demandfile.intake import (
    DemandFileError,
    FileDemandSource,
    demand_of,
    read_demand_file,
)
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.settings import KubernetesClusterSettings, PartitionSettings, Settings
from sco.domain.pools import Pool
from sco.ports import (
    AckReader,
    Clock,
    DemandSource,
    EventLog,
    SchedulerCluster,
    ServerView,
    TokenCourier,
    TokenLedger,
)
from sco.runtime.outbox import relay
from sco.runtime.tokens import TokenIssuer

Relay = Callable[[], int]
log = logging.getLogger(__name__)


class StartError(Exception):
    """Something named in the configuration or on the command line cannot be used."""


def open_store(
    settings: Settings,
    run_migrations: bool = True,
    patient: bool = False,
    sleep: Callable[[float], object] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> SqlFleetStore:
    """The fleet state. A `patient` opener (a long-running process) keeps trying for
    `state.start_wait_s`: a replica started while the database fails over, or before
    it is up, waits for it, as it would once running, rather than exit."""
    deadline = monotonic() + (settings.state.start_wait_s if patient else 0.0)
    wait_s = 1.0
    while True:
        try:
            return SqlFleetStore(settings.state.url, run_migrations=run_migrations)
        except OperationalError as e:
            why = f"state.url: cannot reach the database: {_first_line(e)}"
            left = deadline - monotonic()
            if left <= 0:
                raise StartError(why) from None
            log.warning("%s; trying again for up to %.0f s (state.start_wait_s)", why, left)
            sleep(min(wait_s, left))
            wait_s = min(2 * wait_s, 10.0)
        except ModuleNotFoundError as e:
            raise StartError(
                f"state.url: {e.name} is not installed (pip install 'sco[postgres]')"
            ) from None


def _first_line(e: OperationalError) -> str:
    return str(e.orig).strip().splitlines()[0] if e.orig else type(e).__name__


@dataclass
class Events:
    """The event log as configured, how the outbox reaches it, and how to let it go."""

    log: EventLog
    relay: Relay  # move what the outbox holds into the log; returns how many
    close: Callable[[], None]
    kind: str


def open_events(settings: Settings, store: SqlFleetStore) -> Events:
    cfg = settings.events
    if cfg.kind == "kafka":
        assert cfg.kafka is not None
        try:
            from sco.adapters.kafka.eventlog import KafkaEventLog
        except ModuleNotFoundError:
            raise StartError("events.kind kafka: pip install 'sco[kafka]'") from None
        k = cfg.kafka
        try:
            kafka = KafkaEventLog(
                k.brokers,
                k.librdkafka(),
                topic_prefix=k.topic_prefix,
                regions=_regions(settings, store),
                new_topic_partitions=k.new_topic_partitions,
                poll_timeout_s=0.5,
            )
        except (ValueError, Exception) as e:
            raise StartError(f"events.kafka: {type(e).__name__}: {e}") from None
        return Events(kafka, lambda: relay(store, kafka), kafka.close, "kafka")
    if cfg.url is None:
        shared = SqlEventLog(store.engine)
        return Events(shared, shared.absorb_outbox, lambda: None, "embedded")
    try:
        own = SqlEventLog.open(cfg.url)
    except OperationalError as e:
        raise StartError(f"events.url: cannot reach the database: {_first_line(e)}") from None
    return Events(own, lambda: relay(store, own), own.close, "embedded")


def _regions(settings: Settings, store: SqlFleetStore) -> list[str] | None:
    """The regions whose topics consumers subscribe to by name (created if missing, so a
    consumer started before the first event does not wait for a metadata refresh to
    find its topic): configured, else the provider's, else those of the known pools;
    None subscribes to every topic with the prefix."""
    assert settings.events.kafka is not None
    if settings.events.kafka.regions:
        return settings.events.kafka.regions
    if settings.provider.region_file is not None:
        from sco.adapters.openstack.config import RegionFileError, load_region

        try:
            return [load_region(settings.provider.region_file).region]
        except RegionFileError as e:
            raise StartError(f"provider.region_file: {e}") from None
    regions = sorted({p.region for p in store.pools()})
    return regions or None


def open_history(settings: Settings, hold: bool = False) -> Any:
    """Pool history in ClickHouse or chDB (`sco.adapters.clickhouse.ClickHouseHistory`);
    `hold`: a long-running process keeps chDB open between calls."""
    try:
        from sco.adapters.clickhouse.history import ClickHouseHistory, HistoryUnavailable
    except ModuleNotFoundError:
        raise StartError("history: pip install 'sco[history]'") from None
    h = settings.history
    try:
        return ClickHouseHistory(
            h.url,
            h.database,
            h.username,
            h.password.get_secret_value() if h.password else None,
            hold=hold,
        )
    except HistoryUnavailable as e:
        raise StartError(f"history.url: cannot reach pool history: {e}") from None
    except Exception as e:
        raise StartError(f"history.url: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def open_leases(settings: Settings, store: SqlFleetStore) -> Any:
    """Partition leases and replica membership, in the database or as Kubernetes Leases."""
    cfg = settings.leases
    if cfg.kind == "database":
        from sco.adapters.sqlstate.leases import SqlLeases

        return SqlLeases(store.engine)
    try:
        from sco.adapters.kubernetes.leases import connect
    except ModuleNotFoundError:
        raise StartError("leases.kind kubernetes: pip install 'sco[kubernetes]'") from None
    k = cfg.kubernetes
    try:
        return connect(k.namespace, k.kubeconfig, k.context)
    except Exception as e:
        raise StartError(f"leases.kubernetes: {type(e).__name__}: {e}") from None


def demand(settings: Settings, region: str, start_s: float) -> FileDemandSource:
    """The static partitions, from `partitions` (demand: static) or `demand_file`."""
    try:
        if settings.demand_file is not None:
            return FileDemandSource(
                read_demand_file(settings.demand_file, region), start_s, str(settings.demand_file)
            )
        static = [p for p in settings.partitions if p.demand == "static"]
        return FileDemandSource(demand_of(static, region, "partitions"), start_s)
    except DemandFileError as e:
        raise StartError(str(e)) from None


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
) -> SchedulerPlane:
    """Static partitions keep servers as nodes (drained when asked, or when their agent
    says so with `agents: true` and `acks`); Slurm partitions get their cluster's demand
    and nodes (checked at start: reachable, partitions known, output readable), and
    Kubernetes partitions theirs (checked at start: the kubeconfig loads, the API
    server answers and lets sco list nodes and pods). `pools` are the provider's: a
    Kubernetes node is labelled with its pool's class."""
    from sco.adapters.standalone import AgentNodes, ServersAsNodes
    from sco.runtime.routing import DemandRouter, NodeRouter

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
            settings, kube, region, listing, clock, pools
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


def token_issuers(
    settings: Settings, ledger: TokenLedger, courier: TokenCourier
) -> dict[str, TokenIssuer]:
    """A node-token issuer for each partition whose nodes run `sco agent`."""
    issuer = TokenIssuer(ledger, courier, settings.distributor.token_ttl_s)
    return {p.name: issuer for p in settings.partitions if p.agents}


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
        c = settings.kubernetes_cluster(name)
        core = _kube_client(name, c)
        parts = {p.name: _kube_partition(p, settings.installation) for p in members}
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

        def close(watching: tuple[Informer, ...] = (nodes, pods)) -> None:
            for informer in watching:
                informer.stop()

        out.append(
            (
                KubernetesDemandSource(
                    pods, nodes, demand_specs, core, c.timeout_s, listing, pools
                ),
                KubernetesNodes(core, nodes, pods, clock, c.grace_s, parts, listing, pools),
                [p.name for p in members],
                close,
            )
        )
    return out


def _scheduler_figures(p: PartitionSettings, region: str) -> tuple[Any, int, int, int]:
    """A scheduler-driven partition's domain Partition and its fixed figures: floor,
    guaranteed budget (default: its max) and the target it never goes below (the
    settings make floor and target numbers for such partitions)."""
    from sco.domain.demand import Partition, SchedulerKind

    floor = p.floor_units if isinstance(p.floor_units, int) else 0
    target = p.target_units if isinstance(p.target_units, int) else 0
    budget = p.max_units if p.guaranteed_budget_units is None else p.guaranteed_budget_units
    partition = Partition(p.name, region, SchedulerKind(p.kind), frozenset(p.flavors))
    return partition, floor, budget, target


def _kube_client(name: str, c: KubernetesClusterSettings) -> Any:
    """A `CoreV1Api` for the cluster, once it has answered a list of nodes and of pods."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    where = f"kubernetes.{name}"
    try:
        if c.in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            path = str(c.kubeconfig) if c.kubeconfig is not None else None
            config.load_kube_config(path, c.context, client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as e:
        what = "kubeconfig" if not c.in_cluster else "in_cluster"
        raise StartError(f"{where}.{what}: {_one_line(e)}") from None
    except Exception as e:  # a kubeconfig that is not YAML
        raise StartError(f"{where}.kubeconfig: {type(e).__name__}: {_one_line(e)}") from None
    cfg.retries = 0  # a start check must not wait out urllib3's retries
    core = client.CoreV1Api(client.ApiClient(cfg))
    try:
        core.list_node(limit=1, _request_timeout=c.timeout_s, _preload_content=False)
        core.list_pod_for_all_namespaces(
            limit=1, _request_timeout=c.timeout_s, _preload_content=False
        )
    except ApiException as e:
        raise StartError(
            f"{where}: the API server at {cfg.host} refused: {e.status} {e.reason}"
        ) from None
    except Exception as e:  # unreachable: refused, timed out, name unknown, TLS
        raise StartError(
            f"{where}: cannot reach the API server at {cfg.host}: {type(e).__name__}"
        ) from None
    return core


def _kube_partition(p: PartitionSettings, installation: str) -> Any:
    """The partition's labels default to `sco.io/partition=<name>`, and for a named
    installation also `sco.io/installation=<name>`: sco deletes a Node only when it
    carries all of them, so another sco's nodes in the cluster are never its own."""
    from sco.adapters.kubernetes.demand import KubePartition
    from sco.adapters.kubernetes.nodes import label_value
    from sco.adapters.kubernetes.pods import INSTALLATION_LABEL, PARTITION_LABEL

    k = p.kubernetes
    assert k is not None
    mine = {PARTITION_LABEL: label_value(p.name)}
    if installation != "default":
        mine[INSTALLATION_LABEL] = installation
    part = KubePartition(
        labels=dict(k.labels) or mine,
        allocatable=dict(k.allocatable),
        spot_taint=k.spot_taint,
        daemonset_overhead=dict(k.daemonset_overhead),
    )
    try:
        part.shape()
    except ValueError as e:  # a quantity the API would not accept either
        raise StartError(f"partitions.{p.name}.kubernetes: {_one_line(e)}") from None
    return part


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def require(settings: Settings, *fields: str, partitions: bool = False) -> None:
    """Fail when a setting a command needs is missing."""
    for dotted in fields:
        node: Any = settings
        for part in dotted.split("."):
            node = getattr(node, part)
        if node is None or node == []:
            raise StartError(f"{dotted}: not set (in sco.yaml, SCO_{_env(dotted)}, or a flag)")
    if partitions and not settings.partitions and settings.demand_file is None:
        raise StartError("partitions: none configured (partitions or demand_file)")


def _env(dotted: str) -> str:
    return "__".join(dotted.upper().split("."))
