"""The Kubernetes intake on the API's JSON: requests, who counts, and nodes to add."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from sco.adapters.kubernetes.pods import (
    NodeShape,
    Taint,
    intake,
    is_unschedulable,
    node_room,
    placement_refusal,
    request_of,
)
from sco.decide.binpack import Size

ALLOCATABLE = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "2"}
NODE = {"status": {"allocatable": ALLOCATABLE | {"ephemeral-storage": "100Gi"}}}
LABELS = {
    "sco.io/partition": "gpu",
    "sco.io/capacity-class": "spot",
    "topology.kubernetes.io/zone": "h1",
}
SHAPE = NodeShape(node_room(NODE), LABELS, (Taint("sco.io/capacity-class", "spot", "NoSchedule"),))
TOLERATE = [{"key": "sco.io/capacity-class", "operator": "Exists", "effect": "NoSchedule"}]


def pending(name: str, cpu: str, mem: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": limits},
                }
            ],
            "tolerations": TOLERATE,
            **spec,
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def test_a_pods_request_is_what_the_scheduler_reserves() -> None:
    pod = pending("a", "500m", "1Gi", gpus=1)
    pod["spec"]["containers"].append(
        {"name": "side", "resources": {"limits": {"cpu": "250m", "memory": "256Mi"}}}
    )  # a limit alone is the request
    pod["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}
    ]  # the largest init container, when more than the containers' sum
    pod["spec"]["overhead"] = {"cpu": "100m", "memory": "10Mi"}
    got = request_of(pod)
    assert got.cpus == pytest.approx(2.1)
    assert got.memory_mb == pytest.approx(1024 + 256 + 10)
    assert got.gres == {"nvidia.com/gpu": 1, "pods": 1}
    assert node_room(NODE) == Size(8.0, 32 * 1024.0, {"pods": 110, "nvidia.com/gpu": 2})


def test_only_pods_the_scheduler_gave_up_on_count() -> None:
    assert is_unschedulable(pending("a", "1", "1Gi"))
    running = pending("b", "1", "1Gi")
    running["status"] = {"phase": "Running"}
    bound = pending("c", "1", "1Gi", nodeName="n1")
    waiting = pending("d", "1", "1Gi")
    waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    assert not any(is_unschedulable(p) for p in (running, bound, waiting))


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({}, ""),
        ({"nodeSelector": {"sco.io/partition": "gpu"}}, ""),
        ({"nodeSelector": {"sco.io/partition": "cpu"}}, "node selector sco.io/partition=cpu"),
        ({"tolerations": []}, "taint sco.io/capacity-class=spot:NoSchedule"),
        ({"tolerations": [{"key": "sco.io/capacity-class", "value": "spot"}]}, ""),
        ({"tolerations": [{"key": "sco.io/capacity-class", "value": "no"}]}, "taint"),
        ({"tolerations": [{"operator": "Exists"}]}, ""),
        (
            {
                "tolerations": [
                    {"key": "sco.io/capacity-class", "operator": "Exists", "effect": "NoExecute"}
                ]
            },
            "taint",
        ),
    ],
)
def test_selectors_and_tolerations(spec: dict[str, Any], why: str) -> None:
    got = placement_refusal(pending("a", "1", "1Gi", **spec), SHAPE)
    assert got.startswith(why) if why else got == ""


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                }
            }
        }
    }


@pytest.mark.parametrize(
    ("terms", "ok"),
    [
        ([[{"key": "sco.io/capacity-class", "operator": "In", "values": ["spot"]}]], True),
        ([[{"key": "sco.io/capacity-class", "operator": "In", "values": ["guaranteed"]}]], False),
        ([[{"key": "sco.io/capacity-class", "operator": "NotIn", "values": ["guaranteed"]}]], True),
        ([[{"key": "gpu-type", "operator": "Exists"}]], False),
        ([[{"key": "gpu-type", "operator": "DoesNotExist"}]], True),
        # Terms are ORed, expressions within a term ANDed.
        (
            [
                [{"key": "gpu-type", "operator": "Exists"}],
                [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["h1"]}],
            ],
            True,
        ),
        (
            [
                [
                    {"key": "sco.io/capacity-class", "operator": "In", "values": ["spot"]},
                    {"key": "gpu-type", "operator": "Exists"},
                ]
            ],
            False,
        ),
    ],
)
def test_required_node_affinity(terms: list[list[dict[str, Any]]], ok: bool) -> None:
    got = placement_refusal(pending("a", "1", "1Gi", **_affinity(*terms)), SHAPE)
    assert (got == "") is ok


def test_fifty_pods_of_mixed_shapes_against_an_independent_packing() -> None:
    """50 pending pods of four shapes, two of them never able to run on the
    partition's nodes (too big, another pool's selector): the count of nodes equals
    an independent first fit by hand over the same requests."""
    rng = random.Random(7)
    shapes = [("500m", "1Gi", 0), ("2", "4Gi", 0), ("3", "8Gi", 1), ("1", "20Gi", 0)]
    pods = [pending(f"p{i}", *rng.choice(shapes)) for i in range(48)]
    pods.append(pending("huge", "16", "1Gi"))
    pods.append(pending("other", "1", "1Gi", nodeSelector={"sco.io/partition": "cpu"}))
    free = [Size(1.0, 2048.0, {"pods": 10, "nvidia.com/gpu": 0})]
    got = intake(pods, SHAPE, free)
    assert got.counted == 48
    assert dict(got.unfit) == {
        "ns/huge": "requests more than a node of the partition offers",
        "ns/other": "node selector sco.io/partition=cpu",
    }
    # By hand: sort by CPU then memory, each into the first node with room.
    sizes = sorted(((float(_cpu(p)), _mem_mb(p), _gpus(p)) for p in pods[:48]), reverse=True)
    nodes: list[list[float]] = [[1.0, 2048.0, 0.0, 10.0]]
    for cpu, mem, gpu in sizes:
        for n in nodes:
            if n[0] >= cpu - 1e-9 and n[1] >= mem and n[2] >= gpu and n[3] >= 1:
                n[0] -= cpu
                n[1] -= mem
                n[2] -= gpu
                n[3] -= 1
                break
        else:
            nodes.append([8.0 - cpu, 32768.0 - mem, 2.0 - gpu, 109.0])
    assert got.new_nodes == len(nodes) - 1
    cpu_sum = sum(s[0] for s in sizes)
    assert got.new_nodes >= math.ceil((cpu_sum - 1.0) / 8.0)  # no fewer than the CPU needs


def _cpu(p: dict[str, Any]) -> float:
    v = p["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    return float(v[:-1]) / 1000 if v.endswith("m") else float(v)


def _mem_mb(p: dict[str, Any]) -> float:
    return float(p["spec"]["containers"][0]["resources"]["requests"]["memory"][:-2]) * 1024


def _gpus(p: dict[str, Any]) -> float:
    return float(p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))


# ---------------------------------------------------------------- a partition's need


def node(name: str, cordoned: bool = False, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": LABELS | labels},
        "spec": {"unschedulable": cordoned},
        "status": {
            "allocatable": ALLOCATABLE,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def running(name: str, on: str, cpu: str, mem: str, daemon: bool = False) -> dict[str, Any]:
    p = pending(name, cpu, mem, nodeName=on)
    p["status"] = {"phase": "Running"}
    if daemon:
        p["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds"}]
    return p


def test_a_partitions_need_counts_busy_nodes_the_room_pending_pods_take_and_new_ones() -> None:
    from sco.adapters.kubernetes.demand import KubePartition, need

    part = KubePartition(
        labels={"sco.io/partition": "gpu"},
        allocatable=ALLOCATABLE,
        spot_taint=True,
        daemonset_overhead={"cpu": "500m", "memory": "512Mi"},
    )
    nodes = [
        node("n1"),
        node("n2"),
        node("n3"),
        node("leaving", cordoned=True),  # takes nothing, counts for nothing
        node("x", **{"sco.io/partition": "cpu"}),
    ]
    pods = [
        running("web", "n1", "6", "8Gi"),  # n1 busy, 2 CPUs left
        running("ds1", "n1", "0", "0"),
        running("ds2", "n2", "500m", "512Mi", daemon=True),  # n2 runs only a DaemonSet
        running("elsewhere", "x", "8", "8Gi"),  # not ours
        running("going", "leaving", "1", "1Gi"),
        pending("small", "1500m", "1Gi"),
        pending("mid", "7", "8Gi"),
        pending("big", "7500m", "16Gi"),
        pending("huge", "8", "1Gi"),  # never: a new node has 7.5 CPUs after its DaemonSets
    ]
    got = need(pods, nodes, part)
    assert got.busy == 1
    assert dict(got.unfit) == {"ns/huge": "requests more than a node of the partition offers"}
    # Largest first, each into the first node with room: big into n2 (7.5 CPUs left
    # by its DaemonSet), mid into n3 (8, nothing runs there), small into n1 (2 left).
    assert got.new_nodes == 0
    assert got.nodes == 3
    assert got.guaranteed == 0


def test_pods_only_guaranteed_nodes_may_run_need_guaranteed_nodes() -> None:
    """With the spot taint, a pod that does not tolerate it (or selects the guaranteed
    class) goes to guaranteed nodes: into their room first, then new ones, and those
    are the partition's guaranteed need; tolerating pods take what room is left."""
    from sco.adapters.kubernetes.demand import KubePartition, need

    part = KubePartition({"sco.io/partition": "gpu"}, ALLOCATABLE, spot_taint=True)
    g = {"sco.io/capacity-class": "guaranteed"}
    nodes = [node("g1", **g), node("s1")]
    db = running("db", "g1", "2", "4Gi")
    db["spec"]["tolerations"] = []  # a spot node would refuse it: g1 is held for it
    pods = [
        db,
        pending("strict-1", "5", "8Gi", tolerations=[]),  # only guaranteed: into g1's 6 CPUs
        pending("strict-2", "5", "8Gi", nodeSelector=g),  # selects guaranteed: a new one
        pending("easy", "1", "1Gi"),  # tolerates spot: the room left on g1
        pending("spot-big", "8", "8Gi"),  # tolerates spot: s1 holds it
    ]
    got = need(pods, nodes, part)
    assert got.unfit == ()
    assert got.busy == 1
    assert got.new_nodes == 1
    assert got.nodes == 3  # g1, s1 and one new guaranteed node
    assert got.guaranteed == 2  # g1 (runs db, takes strict-1) and the new one
    # Without the taint only the selector keeps a pod off spot nodes: strict-2 takes
    # g1's room, and strict-1 a new node of either class.
    loose = need(pods, nodes, KubePartition({"sco.io/partition": "gpu"}, ALLOCATABLE))
    assert (loose.nodes, loose.guaranteed, loose.new_nodes) == (3, 1, 1)
    # Tolerant pods that filled the guaranteed node first keep it, and the strict pod
    # still needs a guaranteed node of its own.
    filled = [running("a", "g1", "1", "1Gi"), running("b", "g1", "7", "8Gi"),
              pending("strict", "1", "1Gi", tolerations=[])]  # fmt: skip
    got = need(filled, nodes, part)
    assert (got.nodes, got.guaranteed, got.new_nodes) == (2, 2, 1)


def test_a_listed_server_s_node_counts_before_sco_s_labels_reach_it() -> None:
    """Regression: a guaranteed node that had just joined, not yet labelled in the
    informer's cache, did not count, and the planner released the node its pod ran on."""
    from sco.adapters.kubernetes.demand import KubePartition, need
    from sco.domain.pools import CapacityClass

    part = KubePartition({"sco.io/partition": "gpu"}, ALLOCATABLE, spot_taint=True)
    fresh = node("fresh")
    fresh["metadata"]["labels"] = {}
    fresh["spec"]["providerID"] = "openstack:///srv-9"
    pods = [running("db", "fresh", "1", "1Gi")]
    assert need(pods, [fresh], part).nodes == 0  # not known as ours
    got = need(pods, [fresh], part, {"srv-9": CapacityClass.GUARANTEED})
    assert (got.nodes, got.guaranteed) == (1, 1)


# ---------------------------------------------------------------- objects not of their shape
# Regressions from bench/fuzz.py (issue 17): a pod or node with a field of another
# JSON type (a list of selectors, a quantity that is not one, a node whose metadata
# is a list, a Ready time that is a number) raised from inside `need`, so one object
# stopped the whole partition's count. Now such a pod is reported unfit with why, such
# a node is left out and reported, and the others are counted.


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (lambda p: p["spec"].update(nodeSelector=["a"]), "AttributeError"),
        (lambda p: p["spec"].update(tolerations=[3]), "AttributeError"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="1x"),
         "ValueError"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="1e400"),
         "no finite size"),
        (lambda p: p.update(spec=["x"]), "AttributeError"),
        (lambda p: p["status"].update(conditions=[None]), "AttributeError"),
    ],
)  # fmt: skip
def test_an_unreadable_pod_is_reported_and_the_rest_counted(spoil: Any, said: str) -> None:
    from sco.adapters.kubernetes.demand import KubePartition, need

    part = KubePartition({"sco.io/partition": "gpu"}, ALLOCATABLE, spot_taint=True)
    bad = pending("bad", "1", "1Gi")
    spoil(bad)
    got = need([bad, pending("good", "1", "1Gi")], [], part)
    assert got.counted == 1
    assert got.new_nodes == 1
    ((name, why),) = got.unfit
    assert name == "ns/bad"
    assert why.startswith("cannot be read: ")
    assert said in why


def test_an_unreadable_node_is_left_out_and_reported() -> None:
    from sco.adapters.kubernetes.demand import KubePartition, need

    part = KubePartition(labels={"sco.io/partition": "gpu"}, allocatable=ALLOCATABLE)
    broken = node("broken")
    broken["status"]["allocatable"] = {"cpu": "many"}
    pods = [running("web", "n1", "6", "8Gi"), running("db", "broken", "1", "1Gi")]
    got = need(pods, [node("n1"), broken, {"metadata": []}, "n3"], part)
    assert got.busy == 1
    assert [n for n, _ in got.unreadable_nodes] == ["broken", "?", "?"]


@pytest.mark.parametrize("at", [1700000000, "yesterday", "", None, ["2026-01-01T00:00:00Z"]])
def test_a_ready_node_with_an_unreadable_time_says_zero(at: Any) -> None:
    from sco.adapters.kubernetes.pods import ready_since, server_of

    n = node("n1")
    n["status"]["conditions"][0]["lastTransitionTime"] = at
    assert ready_since(n) == 0.0
    assert ready_since({"status": {"conditions": "Ready"}}) is None
    assert server_of({"spec": ["openstack:///x"]}) == ""
    assert server_of({"spec": {"providerID": 7}}) == ""
