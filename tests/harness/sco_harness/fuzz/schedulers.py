"""What the schedulers tell sco: Slurm's JSON (`squeue`, `sinfo`, `sacct --json`) and
Kubernetes pods and nodes as the API server sends them.

Slurm: a case is what each tool prints (a real answer with a few things changed,
at times not JSON). The parsers read it or raise `SlurmBadOutput` naming the tool
and the field, and what they accept keeps its promises (whole, positive node
counts; finite sizes and times). Then the partition's demand and its nodes are
read through the real `SlurmTools` on a runner that prints the case: a `Demand`
within the partition's bounds, or `SchedulerUnavailable`.

Kubernetes: a case is a list of pods and a list of nodes, mutated from real ones.
The partition's need is counted from them (`need`), and a node's readiness and
server read (`ready_since`, `server_of`): every pod and node is either counted or
reported, none stops the count.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from sco.adapters.kubernetes.demand import KubePartition, need
from sco.adapters.kubernetes.pods import ready_since, server_of
from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
from sco.adapters.slurm.model import SlurmBadOutput, parse_allocations, parse_jobs, parse_nodes
from sco.adapters.slurm.nodes import SlurmNodes, SlurmPartition, SlurmView, node_name
from sco.adapters.slurm.tools import ClusterTools, SlurmError, SlurmTools
from sco.decide.binpack import Size
from sco.domain.demand import Partition, SchedulerKind
from sco.domain.pools import CapacityClass
from sco.engine.clock import ManualClock
from sco.ports import SchedulerUnavailable, ServerStatus, ServerView
from sco_harness.fuzz import Check, Judge, Target
from sco_harness.fuzz.values import JUNK, mutated

NOW = 1_764_000_000.0
SERVER = "0b5e1c2a-7a43-4f7e-9d0e-5c2b8f9a1d3e"
NODE = node_name(SERVER)
FEATURES = "sco,sco-hpc,spot,pool-hall-a-spot-small"


def _job(job_id: int, state: str, **over: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "job_state": state,
        "state_reason": "Resources" if state == "PENDING" else "None",
        "partition": "batch",
        "node_count": 1,
        "cpus": 2,
        "tres_req_str": "cpu=2,mem=1000M,node=1,billing=2",
        "tres_per_node": "",
        "memory_per_node": None,
        "features": "",
        "requeue": True,
        "time_limit": 60,
        "end_time": int(NOW) + 3600,
        "job_resources": {},
    } | over


def _node(name: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "state": "idle",
        "state_flags": ["DYNAMIC_NORM"],
        "features": FEATURES,
        "active_features": FEATURES,
        "reason": "",
        "cpus": 2,
        "alloc_cpus": 0,
        "real_memory": 2000,
        "alloc_memory": 0,
        "partitions": ["batch"],
        "last_busy": int(NOW) - 60,
        "slurmd_start_time": int(NOW) - 600,
    } | over


SQUEUE = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}},
    "errors": [],
    "jobs": [
        _job(11, "PENDING"),
        _job(12, "PENDING", node_count=2, cpus=4, tres_per_node="gres:gpu:1",
             features="guaranteed&fast"),
        _job(13, "RUNNING", job_resources={"allocated_nodes": [{"nodename": NODE}]}),
    ],
}  # fmt: skip
SINFO = {
    "errors": [],
    "nodes": [
        _node(NODE, state="mixed", alloc_cpus=1),
        _node("sco-ffff00001111", state="idle", state_flags=["DRAIN"],
              reason=f"sco: reclaim by {NOW + 20:.0f}"),
    ],
}  # fmt: skip
SACCT = {
    "errors": [],
    "jobs": [
        {"job_id": 13, "nodes": NODE, "time": {"start": int(NOW) - 600, "end": 0}},
        {"job_id": 9, "nodes": "sco-a[1-2]", "time": {"start": int(NOW) - 9000,
                                                       "end": int(NOW) - 5400}},
        {"job_id": 8, "nodes": "None assigned", "time": {"start": 0, "end": 0}},
    ],
}  # fmt: skip
SLURM_WORDS = sorted(
    {k for doc in (SQUEUE, SINFO, SACCT) for k in doc}
    | set(_job(0, "")) | set(_node("")) | {"start", "end", "nodename", "allocated_nodes"}
)  # fmt: skip


@st.composite
def _printed(draw: st.DrawFn, doc: Any) -> str:
    body = draw(mutated(st.just(doc), SLURM_WORDS, most=3))
    try:
        text = json.dumps(body)
    except (ValueError, RecursionError):
        text = "{}"
    how = draw(st.sampled_from(["json"] * 8 + ["empty", "spoilt", "message"]))
    if how == "empty":
        return ""
    if how == "spoilt":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from(JUNK)).decode("latin-1") + text[at:]
    if how == "message":
        return "slurm_load_jobs error: Invalid user for SlurmUser\n"
    return text


def slurm_outputs() -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries(
        {"squeue": _printed(SQUEUE), "sinfo": _printed(SINFO), "sacct": _printed(SACCT)}
    )


PARTITION = SlurmPartition("hpc", ("batch",), Size(2, 2000), requeue_lead_s=30, idle_keep_s=300)
SPEC = SlurmDemandSpec(
    Partition("hpc", "r1", SchedulerKind.SLURM), PARTITION, floor_units=1, max_units=8,
    guaranteed_budget_units=2,
)  # fmt: skip
LISTED = [ServerView(SERVER, "hpc", "r1/hall-a/spot.small", "req-1", 1, ServerStatus.ACTIVE, NOW)]


def _finite(*xs: float) -> bool:
    return all(math.isfinite(x) for x in xs)


def _size_ok(s: Size) -> bool:
    return _finite(s.cpus, s.memory_mb) and all(type(v) is int for v in s.gres.values())


def _runner(outputs: dict[str, str]) -> Any:
    def run(args: Sequence[str], **_kwargs: Any) -> subprocess.CompletedProcess[str]:
        tool = Path(args[0]).name
        return subprocess.CompletedProcess(list(args), 0, outputs.get(tool, ""), "")

    return run


def check_slurm(outputs: dict[str, str], judge: Judge) -> None:
    clear = (SlurmBadOutput,)
    docs: dict[str, Any] = {}
    for tool, text in outputs.items():
        try:
            docs[tool] = json.loads(text)
        except ValueError:
            judge.rejected += 1  # sco's tools refuse it before parsing (SlurmBadOutput)
    if "squeue" in docs:
        jobs = judge.call(lambda: parse_jobs(docs["squeue"], "squeue"), clear)
        for j in jobs or ():
            judge.expect(
                type(j.node_count) is int and j.node_count >= 1 and _size_ok(j.per_node)
                and (j.end_time is None or _finite(j.end_time)),
                "a job: whole node count >= 1, finite size and end",
            )  # fmt: skip
    if "sinfo" in docs:
        nodes = judge.call(lambda: parse_nodes(docs["sinfo"], "sinfo"), clear)
        for n in nodes or ():
            judge.expect(
                _finite(n.last_busy) and (n.registered_at is None or _finite(n.registered_at))
                and all(type(x) is int for x in (n.cpus, n.alloc_cpus, n.memory_mb,
                                                  n.alloc_memory_mb)),
                "a node: whole sizes, finite times",
            )  # fmt: skip
    if "sacct" in docs:
        runs = judge.call(lambda: parse_allocations(docs["sacct"], "sacct"), clear)
        for a in runs or ():
            judge.expect(_finite(a.start) and (a.end is None or _finite(a.end)), "finite runs")
    tools = SlurmTools(ClusterTools("hpc"), run=_runner(outputs))
    view = SlurmView(tools, ["batch"], ttl_s=0.0)
    source = SlurmDemandSource(view, [SPEC], listing=lambda _p: LISTED)
    demand = judge.call(lambda: source.demand("hpc", NOW), (SchedulerUnavailable,))
    if demand is not None:
        judge.expect(
            0 <= demand.target_units <= SPEC.max_units
            and 0 <= demand.guaranteed_units <= demand.target_units,
            "demand within the partition's bounds",
        )
    nodes_plane = SlurmNodes(view, {"hpc": PARTITION}, lambda _p: LISTED, ManualClock(NOW))
    judge.call(lambda: nodes_plane.nodes("hpc"), (SchedulerUnavailable, SlurmError))
    judge.call(lambda: tools.allocations(["batch"], NOW - 86400, NOW), (SlurmBadOutput, SlurmError))


def slurm_target() -> Target:
    @contextmanager
    def world(_folder: Path) -> Iterator[Check]:
        yield check_slurm

    return Target("slurm_json", slurm_outputs(), world, weight=1.0)


# ---------------------------------------------------------------- Kubernetes


def _pod(name: str, **over: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1"}]},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m",
                                                                      "memory": "256Mi"},
                                                         "limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "10m"},
            "nodeSelector": {"sco.io/partition": "web"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "sco.io/capacity-class", "operator": "In", "values": ["spot"]},
                    {"key": "size", "operator": "Gt", "values": ["2"]}]}]}}},
            "tolerations": [{"key": "sco.io/capacity-class", "operator": "Exists",
                             "effect": "NoSchedule"}],
        },
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    } | over  # fmt: skip


def _kube_node(name: str, server: str, **over: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"sco.io/partition": "web",
                                              "sco.io/capacity-class": "spot", "size": "4"}},
        "spec": {"providerID": f"openstack:///{server}", "unschedulable": False},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-11-29T10:01:02Z"}],
        },
    } | over  # fmt: skip


PODS = [
    _pod("web-a"),
    _pod("web-b", spec={"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}),
    _pod("running", spec={"nodeName": "n1", "containers": [{"name": "c"}]},
         status={"phase": "Running"}),
    _pod("ds", metadata={"name": "ds", "ownerReferences": [{"kind": "DaemonSet"}]},
         spec={"nodeName": "n1", "containers": []}, status={"phase": "Running"}),
]  # fmt: skip
NODES = [_kube_node("n1", SERVER), _kube_node("n2", "other")]
KUBE_WORDS = sorted(
    {
        "metadata", "spec", "status", "name", "namespace", "labels", "containers",
        "initContainers", "resources", "requests", "limits", "overhead", "nodeSelector",
        "affinity", "tolerations", "phase", "conditions", "type", "reason", "nodeName",
        "allocatable", "providerID", "unschedulable", "lastTransitionTime", "cpu", "memory",
        "pods", "key", "operator", "values", "effect", "value", "ownerReferences", "kind",
        "matchExpressions", "matchFields", "nodeSelectorTerms", "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    }
)  # fmt: skip
QUANTITIES = ("1", "0", "500m", "1.5", "1e3", "1Ki", "1Gi", "2E", "-1", "1x", "", "0.1m", "1e400")


@st.composite
def kube_objects(draw: st.DrawFn) -> tuple[list[Any], list[Any]]:
    pods = draw(mutated(st.just(copy.deepcopy(PODS)), KUBE_WORDS, most=4))
    nodes = draw(mutated(st.just(copy.deepcopy(NODES)), KUBE_WORDS, most=3))
    if draw(st.booleans()) and isinstance(pods, list) and pods and isinstance(pods[0], dict):
        # A quantity of any spelling, where the requests are.
        spec = pods[0].get("spec")
        if isinstance(spec, dict):
            spec["containers"] = [
                {
                    "resources": {
                        "requests": {
                            draw(
                                st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods"])
                            ): draw(st.sampled_from(QUANTITIES) | st.integers() | st.floats())
                        }
                    }
                }
            ]
    return pods, nodes  # fmt: skip


PART = KubePartition(
    {"sco.io/partition": "web"},
    {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "2"},
    spot_taint=True,
)


def check_kube(case: tuple[Any, Any], judge: Judge) -> None:
    pods, nodes = case
    if not isinstance(pods, list) or not isinstance(nodes, list):
        return  # the informers hold lists of what the API server listed
    got = judge.call(lambda: need(pods, nodes, PART, {SERVER: CapacityClass.SPOT}), ())
    if got is not None:
        judge.expect(
            all(type(x) is int and x >= 0 for x in (got.nodes, got.busy, got.guaranteed,
                                                     got.counted, got.new_nodes))
            and got.guaranteed <= got.nodes,
            "a need in whole nodes >= 0",
        )  # fmt: skip
    for node in nodes:
        if not isinstance(node, dict):
            continue  # their type is an object's; `need` above had every element
        at = judge.call(functools.partial(ready_since, node), ())
        judge.expect(at is None or _finite(at), "a finite ready time")
        judge.call(functools.partial(server_of, node), ())


def kube_target() -> Target:
    @contextmanager
    def world(_folder: Path) -> Iterator[Check]:
        yield check_kube

    return Target("kubernetes_objects", kube_objects(), world, weight=1.0)
