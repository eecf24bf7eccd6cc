"""Pending pods as nodes to add: what the Kubernetes intake counts, on the API's JSON.

Pure functions on pods and nodes as the API server sends them (plain JSON, not the
client's models: ten thousand pods are read in a fraction of a second this way).

- A pod counts when the scheduler has given up on it for now (phase Pending, no
  node, condition `PodScheduled=False` with reason `Unschedulable`) and a node of
  the partition could run it: its node selector and required node affinity match
  the partition's node labels, it tolerates the partition's NoSchedule and
  NoExecute taints, and its requests fit the node's allocatable room less what
  the DaemonSets take there.
- A pod's request is what the scheduler reserves: the sum over its containers,
  or the largest init container when that is more, per resource, plus the pod's
  overhead; one of the node's pod slots (`pods`); extended resources (a name with
  a `/`, such as `nvidia.com/gpu`) count whole. Ephemeral storage and huge pages
  are not counted. A shape's room comes from a node's allocatable (`node_room`),
  pod slots included.
- Pods become nodes by first-fit decreasing (`sco.decide.binpack`), after the free
  room of the partition's nodes already there, as Cluster Autoscaler's estimator
  does. A pod no node of the shape could ever run is reported with why, never
  counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sco.decide.binpack import Packing, Size, pack

Json = Mapping[str, Any]
PODS = "pods"  # the node's pod slots, one per pod
_MB = 1024 * 1024


# What sco writes on its nodes: the partition (unless the partition's own labels say
# otherwise), the capacity class, the pool, and the standard zone (= the pool's hall).
PARTITION_LABEL = "sco.io/partition"
INSTALLATION_LABEL = "sco.io/installation"  # a named installation's, beside the partition
CLASS_LABEL = "sco.io/capacity-class"
POOL_LABEL = "sco.io/pool"
ZONE_LABEL = "topology.kubernetes.io/zone"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


# On spot nodes of a partition with `spot_taint`: only pods that tolerate it go there.
SPOT_TAINT = Taint(CLASS_LABEL, "spot", "NoSchedule")


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What a node of the partition offers: its allocatable room less the DaemonSets'
    requests there, and the labels and taints sco gives it."""

    room: Size
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True, slots=True)
class Intake:
    new_nodes: int  # nodes of the shape the counted pods need beyond the free room
    counted: int  # pending pods a node of the partition could run
    unfit: tuple[tuple[str, str], ...]  # (namespace/name, why) of pods it never could
    packing: Packing


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("500m", "1Gi", "2") as a number; ValueError if it is not
    one, or of no finite size."""
    from kubernetes.utils import parse_quantity  # the `kubernetes` extra

    value = float(parse_quantity(text))
    if not math.isfinite(value):
        raise ValueError(f"quantity {text!r} has no finite size")
    return value


def request_of(pod: Json) -> Size:
    """What the scheduler reserves for `pod` on a node (see the module)."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or ():
        for name, v in _requests(c).items():
            total[name] = total.get(name, 0.0) + v
    for c in spec.get("initContainers") or ():
        for name, v in _requests(c).items():
            total[name] = max(total.get(name, 0.0), v)
    for name, v in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0.0) + quantity(v)
    return _size(total, pods=1)


def _requests(container: Json) -> dict[str, float]:
    res = container.get("resources") or {}
    # A limit without a request requests the limit (the API server defaults it so).
    asked = dict(res.get("limits") or {}) | dict(res.get("requests") or {})
    return {name: quantity(v) for name, v in asked.items()}


def _size(resources: Mapping[str, float], pods: int = 0) -> Size:
    gres = {n: int(v) for n, v in resources.items() if "/" in n}
    if pods or PODS in resources:
        gres[PODS] = pods + int(resources.get(PODS, 0))
    return Size(resources.get("cpu", 0.0), resources.get("memory", 0.0) / _MB, gres)


def node_room(node: Json) -> Size:
    """A node's allocatable resources, as the scheduler counts them."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return _size({n: quantity(v) for n, v in alloc.items()})


def is_unschedulable(pod: Json) -> bool:
    """Pending, on no node, and marked unschedulable by the scheduler."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or (pod.get("spec") or {}).get("nodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )


def placement_refusal(pod: Json, shape: NodeShape) -> str:
    """Why a node of `shape` could not run `pod` by its labels and taints ("" if it
    could)."""
    spec = pod.get("spec") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if shape.labels.get(k) != v:
            return f"node selector {k}={v}"
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(t, shape.labels) for t in terms):
        return "required node affinity"
    tolerations = spec.get("tolerations") or ()
    for taint in shape.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(
            _tolerates(t, taint) for t in tolerations
        ):
            return f"taint {taint.key}={taint.value}:{taint.effect}"
    return ""


def _term_matches(term: Json, labels: Mapping[str, str]) -> bool:
    if term.get("matchFields"):
        return False  # fields name one node (metadata.name): never a node yet to come
    return all(_expression(e, labels) for e in term.get("matchExpressions") or ())


def _expression(e: Json, labels: Mapping[str, str]) -> bool:
    key, op, values = e.get("key", ""), e.get("operator", ""), e.get("values") or []
    has = key in labels
    if op == "In":
        return has and labels[key] in values
    if op == "NotIn":
        return not has or labels[key] not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt") and has and values:
        try:
            mine, theirs = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return mine > theirs if op == "Gt" else mine < theirs
    return False


def _tolerates(t: Json, taint: Taint) -> bool:
    if t.get("effect") and t["effect"] != taint.effect:
        return False
    if t.get("operator") == "Exists":
        return not t.get("key") or t["key"] == taint.key
    return t.get("key") == taint.key and (t.get("value") or "") == taint.value


def refusal(pod: Json, shape: NodeShape, size: Size | None = None) -> str:
    """Why a node of `shape` could never run `pod` ("" if it could); `size` is the
    pod's request, when known."""
    why = placement_refusal(pod, shape)
    if not why and not (size or request_of(pod)).fits(shape.room):
        why = "requests more than a node of the partition offers"
    return why


def intake(pods: Iterable[Json], shape: NodeShape, free: Sequence[Size] = ()) -> Intake:
    """The nodes of `shape` the unschedulable pods among `pods` need, after `free`
    (the room left on the partition's nodes already there)."""
    slices: list[Size] = []
    unfit: list[tuple[str, str]] = []
    for pod in pods:
        if not is_unschedulable(pod):
            continue
        size = request_of(pod)
        why = refusal(pod, shape, size)
        if why:
            unfit.append((pod_name(pod), why))
            continue
        slices.append(size)
    packing = pack(slices, shape.room, free)
    return Intake(packing.new_nodes, len(slices), tuple(unfit), packing)


def server_of(node: Json) -> str:
    """The server a node is, from its `providerID` (the OpenStack cloud provider's
    `openstack:///<id>`, or `openstack://<region>/<id>`); "" if none."""
    spec = node.get("spec")
    pid = spec.get("providerID") if isinstance(spec, Mapping) else None
    return pid.rsplit("/", 1)[-1] if isinstance(pid, str) else ""


def is_daemon(pod: Json) -> bool:
    """Run by a DaemonSet: it goes with its node, and does not make a node busy."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return any(o.get("kind") == "DaemonSet" for o in owners)


def pod_name(pod: Json) -> str:
    """namespace/name, as operators and logs name a pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def is_over(pod: Json) -> bool:
    """Succeeded or Failed: it holds no room on its node any more."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pods_by_node(pods: Iterable[Json]) -> dict[str, list[Json]]:
    """The pods still running or to run on each node, by node name."""
    out: dict[str, list[Json]] = {}
    for pod in pods:
        on = (pod.get("spec") or {}).get("nodeName")
        if on and not is_over(pod):
            out.setdefault(on, []).append(pod)
    return out


def ready_since(node: Json) -> float | None:
    """When the node last became Ready (0 when it does not say, or says it unreadably);
    None if it is not."""
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def _time(at: object) -> float:
    """An API server timestamp (RFC 3339) as seconds; 0 when absent or unreadable."""
    if not isinstance(at, str) or not at:
        return 0.0
    try:
        return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
