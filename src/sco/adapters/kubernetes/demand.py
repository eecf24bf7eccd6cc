"""A Kubernetes partition's need in nodes, from the pods and nodes its informers hold.

The partition's nodes are those carrying all of its labels, Ready and not cordoned
(a cordoned node is leaving). A node is needed when pods other than DaemonSets'
run there, or when pending pods will go into its free room (the room left by what
runs there: requests, as the scheduler counts); beyond those, pending pods need
the new nodes `sco.adapters.kubernetes.pods.intake` packs them into, on a node
shape of the partition's allocatable less what its DaemonSets request on every
node.

There are two shapes, one per capacity class: the partition's labels with
`sco.io/capacity-class` set to `spot` or `guaranteed`, and on spot nodes the
spot taint when the partition has `spot_taint`. A pod that only a guaranteed node
can run (it does not tolerate the taint, or it selects the guaranteed class)
needs guaranteed capacity: it is packed first, into the guaranteed nodes' room and
new guaranteed nodes. Every other pod goes into the room left on guaranteed
nodes, then spot nodes, then new nodes of either class (the planner picks). The
demand's `guaranteed_units` are the guaranteed nodes in use (busy, or taking
pending pods) and the new ones guaranteed-only pods need: a guaranteed node that
other pods filled first stays, and the strict pod still gets a node of its own.
A pod neither shape can run is reported, never counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sco.adapters.kubernetes.gangs import gangs
from sco.adapters.kubernetes.informer import Informer
from sco.adapters.kubernetes.pods import (
    CLASS_LABEL,
    INSTALLATION_LABEL,
    SPOT_TAINT,
    Intake,
    Json,
    NodeShape,
    intake,
    is_daemon,
    is_unschedulable,
    node_room,
    placement_refusal,
    pod_name,
    pods_by_node,
    quantity,
    ready_since,
    refusal,
    request_of,
    server_of,
)
from sco.decide.binpack import Size
from sco.domain.demand import Demand, Gang, Partition, within
from sco.domain.installation import DEFAULT_INSTALLATION, is_mine
from sco.domain.pools import CapacityClass, Pool
from sco.ports import SchedulerUnavailable, ServerView

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KubePartition:
    labels: Mapping[str, str]  # every node of the partition carries these
    allocatable: Mapping[str, str]  # a node's allocatable, as its kubelet reports it
    spot_taint: bool = False  # spot nodes carry SPOT_TAINT
    daemonset_overhead: Mapping[str, str] = field(default_factory=dict)  # per node
    installation: str = DEFAULT_INSTALLATION  # the sco whose partition it is

    def identity(self) -> dict[str, str]:
        """The labels that make a node the partition's, as sco writes them: its own
        and, for a named installation, `sco.io/installation` (nodes labelled before
        installations had names carry none: they are `default`'s)."""
        out = dict(self.labels)
        if self.installation != DEFAULT_INSTALLATION:
            out[INSTALLATION_LABEL] = self.installation
        return out

    def owns(self, node: Json) -> bool:
        """Whether the node carries the partition's labels *and* is of its
        installation. Carrying ours among more is not enough: a node of installation
        `b` carries every label of `default`'s partition of the same name."""
        have = (node.get("metadata") or {}).get("labels") or {}
        if not is_mine(have.get(INSTALLATION_LABEL), self.installation):
            return False
        return all(have.get(k) == v for k, v in self.labels.items())

    def overlaps(self, other: KubePartition) -> bool:
        """Whether one node could be both partitions': same installation, and no
        label both set to different values."""
        if self.installation != other.installation:
            return False
        both = self.labels.keys() & other.labels.keys()
        return all(self.labels[k] == other.labels[k] for k in both)

    def shape(self, capacity_class: CapacityClass = CapacityClass.SPOT) -> NodeShape:
        room = node_room({"status": {"allocatable": dict(self.allocatable)}})
        overhead = {n: quantity(v) for n, v in self.daemonset_overhead.items()}
        taken = Size(
            overhead.get("cpu", 0.0),
            overhead.get("memory", 0.0) / (1024 * 1024),
            {n: int(v) for n, v in overhead.items() if "/" in n},
        )
        spot = capacity_class is CapacityClass.SPOT
        return NodeShape(
            _clip(room.less(taken)),
            {**self.identity(), CLASS_LABEL: capacity_class.value},
            (SPOT_TAINT,) if spot and self.spot_taint else (),
        )


@dataclass(frozen=True, slots=True)
class Need:
    nodes: int  # nodes the partition needs: busy, taking pending pods, or new
    busy: int  # of its nodes, those running pods other than DaemonSets'
    guaranteed: int  # of `nodes`, those only guaranteed capacity may be
    counted: int  # pending pods a node of the partition could run
    unfit: tuple[tuple[str, str], ...]  # (namespace/name, why) of pods none could
    new_nodes: int  # of `nodes`, those to add
    unreadable_nodes: tuple[tuple[str, str], ...] = ()  # (name, why): not counted
    gangs: tuple[Gang, ...] = ()  # pods that run together and need new nodes (in nodes)
    bad_checkpoints: tuple[tuple[str, str], ...] = ()  # (pod, why) declarations refused


def need(
    pods: Iterable[Json],
    nodes: Iterable[Json],
    part: KubePartition,
    servers: Mapping[str, CapacityClass] | None = None,
) -> Need:
    """`servers`: the partition's servers by id, with their class. A node is the
    partition's when it carries its labels or is one of those servers (before sco's
    labels have reached it); its class is its server's, else its label's."""
    known = servers or {}
    spot, guaranteed = part.shape(CapacityClass.SPOT), part.shape(CapacityClass.GUARANTEED)
    pods, unfit = _readable_pods(pods, (spot, guaranteed))
    nodes, unreadable = _readable_nodes(nodes, part)
    # A cordoned node is leaving and a node not Ready takes nothing: neither counts.
    ours = [n for n in nodes if (server_of(n) in known or part.owns(n)) and _schedulable(n)]
    classes = [known.get(server_of(n)) or _class_of(n) for n in ours]
    g_nodes = [n for n, c in zip(ours, classes, strict=True) if c is CapacityClass.GUARANTEED]
    s_nodes = [n for n, c in zip(ours, classes, strict=True) if c is CapacityClass.SPOT]
    running = pods_by_node(pods)
    g_free, g_busy = _rooms(g_nodes, running)
    s_free, s_busy = _rooms(s_nodes, running)
    g_only: list[Json] = []
    rest: list[Json] = []
    for pod in pods:
        if not is_unschedulable(pod):
            continue
        size = request_of(pod)
        if not refusal(pod, spot, size):
            rest.append(pod)
        elif not (why := refusal(pod, guaranteed, size)):
            g_only.append(pod)
        else:
            unfit.append((pod_name(pod), why))
    # Guaranteed-only pods first, where only they can go; the rest after, in what is left.
    g_got = intake(g_only, guaranteed, g_free)
    r_got: Intake = intake(rest, spot, [*g_got.packing.free_after, *s_free])
    k = len(g_free)
    g_taking = g_busy | set(g_got.packing.used_free) | {i for i in r_got.packing.used_free if i < k}
    s_taking = s_busy | {i - k for i in r_got.packing.used_free if i >= k}
    new = g_got.new_nodes + r_got.new_nodes
    idle = len(ours) - len(g_busy) - len(s_busy)
    together, refused = gangs(rest, spot, idle)
    return Need(
        nodes=len(g_taking) + len(s_taking) + new,
        busy=len(g_busy) + len(s_busy),
        guaranteed=len(g_taking) + g_got.new_nodes,
        counted=g_got.counted + r_got.counted,
        unfit=tuple(unfit),
        new_nodes=new,
        unreadable_nodes=tuple(unreadable),
        gangs=together,
        bad_checkpoints=refused,
    )


# What reading a pod or node whose fields are not of their JSON types raises: such an
# object is reported and left out, and never stops the count of the others. (The API
# server validates what it stores; this is for what it should never send.)
_UNREADABLE = (TypeError, AttributeError, ValueError, KeyError, IndexError, ArithmeticError)


def _readable_pods(
    pods: Iterable[Json], shapes: Sequence[NodeShape]
) -> tuple[list[Json], list[tuple[str, str]]]:
    """The pods every field sco reads of can be read, and (name, why) of the others."""
    ok: list[Json] = []
    bad: list[tuple[str, str]] = []
    for pod in pods:
        try:
            if not isinstance(pod, Mapping):
                raise TypeError(f"a pod is {type(pod).__name__}, not an object")
            request_of(pod)
            is_daemon(pod)
            pods_by_node([pod])
            if is_unschedulable(pod):
                for shape in shapes:
                    placement_refusal(pod, shape)
        except _UNREADABLE as e:
            bad.append((_name(pod), f"cannot be read: {type(e).__name__}: {str(e)[:200]}"))
        else:
            ok.append(pod)
    return ok, bad


def _readable_nodes(
    nodes: Iterable[Json], part: KubePartition
) -> tuple[list[Json], list[tuple[str, str]]]:
    ok: list[Json] = []
    bad: list[tuple[str, str]] = []
    for node in nodes:
        try:
            if not isinstance(node, Mapping):
                raise TypeError(f"a node is {type(node).__name__}, not an object")
            if not isinstance(node["metadata"]["name"], str):
                raise TypeError("metadata.name is not a string")
            part.owns(node)
            _schedulable(node)
            _class_of(node)
            node_room(node)
        except _UNREADABLE as e:
            name = _name(node).split("/", 1)[1]
            bad.append((name, f"cannot be read: {type(e).__name__}: {str(e)[:200]}"))
        else:
            ok.append(node)
    return ok, bad


def _name(obj: object) -> str:
    """namespace/name of a pod (or a node's name), as far as it can be read."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "/?"
    return f"{meta.get('namespace', '')}/{meta.get('name', '?')}"


def _rooms(nodes: Sequence[Json], running: Mapping[str, list[Json]]) -> tuple[list[Size], set[int]]:
    """Each node's free room, and which run pods other than DaemonSets'."""
    free: list[Size] = []
    busy: set[int] = set()
    for k, node in enumerate(nodes):
        there = running.get(node["metadata"]["name"], [])
        room = node_room(node)
        for p in there:
            room = room.less(request_of(p))
        free.append(_clip(room))
        if any(not is_daemon(p) for p in there):
            busy.add(k)
    return free, busy


def _class_of(node: Json) -> CapacityClass:
    """A node sco has not labelled yet (or one of the cluster's own) counts as
    guaranteed: nothing about it says it can be taken back."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    spot = labels.get(CLASS_LABEL) == CapacityClass.SPOT.value
    return CapacityClass.SPOT if spot else CapacityClass.GUARANTEED


def _schedulable(node: Json) -> bool:
    cordoned = (node.get("spec") or {}).get("unschedulable")
    return not cordoned and ready_since(node) is not None


def _clip(s: Size) -> Size:
    """Room never below zero (a node overcommitted by what was bound before)."""
    return Size(max(0.0, s.cpus), max(0.0, s.memory_mb), {g: max(0, n) for g, n in s.gres.items()})


@dataclass(frozen=True, slots=True)
class KubeDemandSpec:
    partition: Partition
    kube: KubePartition
    floor_units: int
    max_units: int
    guaranteed_budget_units: int
    min_target_units: int = 0  # the target never goes below this
    units_per_node: int = 1  # units one node of the partition's flavor provides


class KubernetesDemandSource:
    """`sco.ports.DemandSource` for the partitions of one cluster, from its pod and
    node informers: the target is the nodes a partition needs, within its max."""

    def __init__(
        self,
        pods: Informer,
        nodes: Informer,
        specs: Sequence[KubeDemandSpec],
        core: Any = None,
        stale_s: float = 30.0,
        listing: Callable[[str], Sequence[ServerView]] | None = None,
        pools: Sequence[Pool] = (),
    ) -> None:
        """`core` (a `CoreV1Api`), when given, gets a Warning Event on each pod no
        node of the partition can run, as Cluster Autoscaler tells why it did not
        scale up. Demand is unavailable while an informer has failed to reach the
        API server for over `stale_s`. `listing` (the provider's last listing of a
        partition's servers) and `pools` make a server's node the partition's as soon
        as it is Ready, with its pool's class."""
        self.stale_s = stale_s
        self._listing = listing
        self._class = {p.id: p.capacity_class for p in pools}
        self._pods = pods
        self._nodes = nodes
        self.specs = {s.partition.name: s for s in specs}
        self.core = core
        self._reported: set[str] = set()
        self._reported_nodes: set[str] = set()
        self._refused: set[str] = set()  # pods whose checkpoint declaration was refused

    def partitions(self) -> Sequence[Partition]:
        return [s.partition for s in self.specs.values()]

    def demand(self, partition: str, now: float) -> Demand:
        """Raises SchedulerUnavailable until the informers have listed once, and while
        one of them has been cut off from the API server for over `stale_s`."""
        if not (self._pods.synced and self._nodes.synced):
            raise SchedulerUnavailable(
                f"kubernetes: pods and nodes not listed yet ({self._pods.last_error or 'waiting'})"
            )
        for informer in (self._pods, self._nodes):
            if informer.failing_for() > self.stale_s:
                raise SchedulerUnavailable(
                    f"kubernetes: {informer.name} cut off from the API server for "
                    f"{informer.failing_for():.0f} s: {informer.last_error}"
                )
        spec = self.specs[partition]
        servers = None
        if self._listing is not None:
            servers = {
                v.server_id: self._class.get(v.pool, CapacityClass.GUARANTEED)
                for v in self._listing(partition)
            }
        n = need(self._pods.items(), self._nodes.items(), spec.kube, servers)
        for name, why in n.unreadable_nodes:
            if name not in self._reported_nodes:
                self._reported_nodes.add(name)
                log.warning("partition %s: node %s not counted: %s", partition, name, why)
        fresh = [(name, why) for name, why in n.unfit if name not in self._reported]
        if fresh:
            self._reported.update(name for name, _ in fresh)
            log.warning("partition %s: pods no node of it can run, not counted: %s", partition,
                        ", ".join(f"{name} ({why})" for name, why in fresh))  # fmt: skip
            for name, why in fresh:
                self._event(partition, name, why, now)
        for pod, why in n.bad_checkpoints:
            if pod not in self._refused:
                self._refused.add(pod)
                log.warning("partition %s: pod %s's checkpoint declaration is refused: %s; "
                            "its gang is placed as one that does not checkpoint",
                            partition, pod, why)  # fmt: skip
        per = spec.units_per_node
        target = min(spec.max_units, max(spec.min_target_units, n.nodes * per))
        together = tuple(replace(g, units=g.units * per) for g in n.gangs)
        return Demand(
            target_units=target,
            floor_units=min(spec.floor_units, spec.max_units),
            max_units=spec.max_units,
            guaranteed_budget_units=spec.guaranteed_budget_units,
            guaranteed_units=min(n.guaranteed * per, target, spec.guaranteed_budget_units),
            unfit_work=len(n.unfit),
            gangs=within(together, n.nodes * per, target),
        )

    def next_change_after(self, now: float) -> float | None:  # noqa: ARG002
        """Unknown: demand changes as pods come."""
        return None

    def _event(self, partition: str, pod: str, why: str, now: float) -> None:
        """A Warning Event on the pod; best effort (the log line and the metric stay)."""
        if self.core is None:
            return
        namespace, name = pod.split("/", 1)
        at = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"name": f"{name}.sco-unfit", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name},
            "reason": "NoNodeOfPartitionFits",
            "message": f"sco partition {partition}: no node it adds could run this pod: {why}",
            "type": "Warning",
            "source": {"component": "sco"},
            "reportingComponent": "sco",
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(namespace, body)
        except Exception as e:  # the pod may be gone, or the event there already
            log.info("event on pod %s not written: %s", pod, str(e).splitlines()[0])
