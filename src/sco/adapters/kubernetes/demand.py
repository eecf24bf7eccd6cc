"""A Kubernetes partition's need in nodes, from the pods and nodes its informers hold.

The partition's nodes are those carrying all of its labels, Ready and not cordoned
(a cordoned node is leaving). A node is needed when
pods other than DaemonSets' run there, or when pending pods will go into its free
room (the room left by what runs there: requests, as the scheduler counts); beyond
those, pending pods need the new nodes `sco.adapters.kubernetes.pods.intake`
packs them into, on a node shape of the partition's allocatable less what its
DaemonSets request on every node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sco.adapters.kubernetes.informer import Informer
from sco.adapters.kubernetes.pods import (
    Intake,
    Json,
    NodeShape,
    Taint,
    intake,
    is_daemon,
    node_room,
    pods_by_node,
    quantity,
    ready_since,
    request_of,
)
from sco.decide.binpack import Size
from sco.domain.demand import Demand, Partition
from sco.ports import SchedulerUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KubePartition:
    labels: Mapping[str, str]  # every node of the partition carries these
    allocatable: Mapping[str, str]  # a node's allocatable, as its kubelet reports it
    taints: tuple[Taint, ...] = ()
    daemonset_overhead: Mapping[str, str] = field(default_factory=dict)  # per node

    def shape(self) -> NodeShape:
        room = node_room({"status": {"allocatable": dict(self.allocatable)}})
        overhead = {n: quantity(v) for n, v in self.daemonset_overhead.items()}
        taken = Size(
            overhead.get("cpu", 0.0),
            overhead.get("memory", 0.0) / (1024 * 1024),
            {n: int(v) for n, v in overhead.items() if "/" in n},
        )
        return NodeShape(_clip(room.less(taken)), self.labels, self.taints)


@dataclass(frozen=True, slots=True)
class Need:
    nodes: int  # nodes the partition needs: busy, taking pending pods, or new
    busy: int  # of its nodes, those running pods other than DaemonSets'
    pending: Intake


def need(pods: Iterable[Json], nodes: Iterable[Json], part: KubePartition) -> Need:
    pods = list(pods)
    # A cordoned node is leaving and a node not Ready takes nothing: neither counts.
    ours = [n for n in nodes if _carries(n, part.labels) and _schedulable(n)]
    running = pods_by_node(pods)
    free = []
    busy: set[int] = set()
    for k, node in enumerate(ours):
        there = running.get(node["metadata"]["name"], [])
        room = node_room(node)
        for p in there:
            room = room.less(request_of(p))
        free.append(_clip(room))
        if any(not is_daemon(p) for p in there):
            busy.add(k)
    got = intake(pods, part.shape(), free)
    taking = busy | set(got.packing.used_free)
    return Need(len(taking) + got.new_nodes, len(busy), got)


def _schedulable(node: Json) -> bool:
    cordoned = (node.get("spec") or {}).get("unschedulable")
    return not cordoned and ready_since(node) is not None


def _carries(node: Json, labels: Mapping[str, str]) -> bool:
    have = (node.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


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
    units_per_node: int = 1  # units one node of the partition's flavor provides


class KubernetesDemandSource:
    """`sco.ports.DemandSource` for the partitions of one cluster, from its pod and
    node informers: the target is the nodes a partition needs, within its max."""

    def __init__(self, pods: Informer, nodes: Informer, specs: Sequence[KubeDemandSpec]) -> None:
        self._pods = pods
        self._nodes = nodes
        self.specs = {s.partition.name: s for s in specs}
        self._reported: set[str] = set()

    def partitions(self) -> Sequence[Partition]:
        return [s.partition for s in self.specs.values()]

    def demand(self, partition: str, now: float) -> Demand:  # noqa: ARG002
        """Raises SchedulerUnavailable until the informers have listed once."""
        if not (self._pods.synced and self._nodes.synced):
            raise SchedulerUnavailable(
                f"kubernetes: pods and nodes not listed yet ({self._pods.last_error or 'waiting'})"
            )
        spec = self.specs[partition]
        n = need(self._pods.items(), self._nodes.items(), spec.kube)
        fresh = [f"{name} ({why})" for name, why in n.pending.unfit if name not in self._reported]
        if fresh:
            self._reported.update(name for name, _ in n.pending.unfit)
            log.warning("partition %s: pods no node of it can run, not counted: %s", partition,
                        ", ".join(fresh))  # fmt: skip
        target = min(spec.max_units, n.nodes * spec.units_per_node)
        return Demand(
            target_units=target,
            floor_units=min(spec.floor_units, spec.max_units),
            max_units=spec.max_units,
            guaranteed_budget_units=spec.guaranteed_budget_units,
        )

    def next_change_after(self, now: float) -> float | None:  # noqa: ARG002
        """Unknown: demand changes as pods come."""
        return None
