"""Pods that run together (gangs), as the Kubernetes intake reports them to the planner.

A pod belongs to a gang when it carries a pod-group label: sco's own `sco.io/gang`, or
the pod group of Kueue (`kueue.x-k8s.io/pod-group-name`) or of the scheduler-plugins'
coscheduling (`scheduling.x-k8s.io/pod-group`); the gang is the namespace's pods of
that name. Its unschedulable pods that need two nodes or more, packed on their own
into nodes of the partition's shape, and that the partition's idle nodes cannot take,
are reported as a `Gang` (oldest first, as the scheduler's queue takes them), so the
planner puts the gang's new nodes in one pool: work spread over pools is lost whole
when any of them goes.

- `whole`: the pods require each other in one pool (a required pod affinity with
  `topologyKey: sco.io/pool`, the label sco writes on every node): the scheduler
  runs the gang only on nodes of one pool.
- `run_s`: the pods' `activeDeadlineSeconds` (the longest), when set.
- `checkpoint_s`: the annotation `sco.io/checkpoint` (`30m`, `90s`, `1.5h`), how
  often the gang saves its work; one that cannot be read is refused (reported with
  why) and the gang is placed as one that does not checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sco.adapters.kubernetes.pods import POOL_LABEL, Json, NodeShape, pod_name, request_of
from sco.decide.binpack import pack
from sco.domain.demand import CheckpointError, Gang, checkpoint_interval

GANG_LABELS = ("sco.io/gang", "kueue.x-k8s.io/pod-group-name", "scheduling.x-k8s.io/pod-group")
CHECKPOINT_ANNOTATION = "sco.io/checkpoint"


def gang_of(pod: Json) -> str:
    """namespace/group of the gang the pod belongs to; "" if none."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key in GANG_LABELS:
        name = labels.get(key)
        if isinstance(name, str) and name:
            return f"{meta.get('namespace', '')}/{name}"
    return ""


def gangs(
    pending: Sequence[Json], shape: NodeShape, idle: int
) -> tuple[tuple[Gang, ...], tuple[tuple[str, str], ...]]:
    """The gangs among `pending` (unschedulable pods a node of `shape` can run) that
    need new nodes, and (pod, why) of checkpoint declarations refused. `idle`: the
    partition's nodes running nothing, which the oldest gangs that fit take first."""
    groups: dict[str, list[Json]] = {}
    for pod in pending:
        name = gang_of(pod)
        if name:
            groups.setdefault(name, []).append(pod)
    out: list[Gang] = []
    refused: list[tuple[str, str]] = []
    for name, pods in sorted(groups.items(), key=lambda g: min(_created(p) for p in g[1])):
        nodes = pack([request_of(p) for p in pods], shape.room).new_nodes
        if nodes < 2:
            continue  # one node: nothing to keep together
        if nodes <= idle:
            idle -= nodes
            continue
        every, why = _checkpoint(pods)
        refused.extend(why)
        whole = all(_kept_in_one_pool(p) for p in pods)
        out.append(Gang(nodes, _deadline(pods), every, name, whole=whole))
    return tuple(out), tuple(refused)


def _checkpoint(pods: Sequence[Json]) -> tuple[float | None, list[tuple[str, str]]]:
    """The shortest interval the gang's pods declare, and the declarations refused."""
    every: list[float] = []
    refused: list[tuple[str, str]] = []
    for pod in pods:
        value = ((pod.get("metadata") or {}).get("annotations") or {}).get(CHECKPOINT_ANNOTATION)
        if value is None:
            continue
        declared = f"{CHECKPOINT_ANNOTATION}: {value}"
        try:
            every.append(checkpoint_interval(str(value), declared))
        except CheckpointError as e:
            refused.append((pod_name(pod), str(e)))
    return (min(every) if every else None), refused


def _deadline(pods: Sequence[Json]) -> float | None:
    limits = [
        float(s)
        for p in pods
        if isinstance(s := (p.get("spec") or {}).get("activeDeadlineSeconds"), int | float)
        and not isinstance(s, bool)
        and s > 0
    ]
    return max(limits) if limits else None


def _kept_in_one_pool(pod: Json) -> bool:
    """Whether the pod requires the pods it selects in the same pool (a required pod
    affinity term over sco's pool label)."""
    affinity: Mapping[str, Any] = ((pod.get("spec") or {}).get("affinity") or {}).get(
        "podAffinity"
    ) or {}
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or ()
    return any(isinstance(t, Mapping) and t.get("topologyKey") == POOL_LABEL for t in terms)


def _created(pod: Json) -> str:
    """Its creation time as the API server writes it (RFC 3339, UTC: sorts as text)."""
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")
