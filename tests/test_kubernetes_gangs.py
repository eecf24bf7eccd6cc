"""Pods that run together: the Kubernetes intake reports a pod group that needs new
nodes as a gang, and the planner puts its nodes in one pool (docs/kubernetes.md)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sco.adapters.kubernetes.demand import (
    KubeDemandSpec,
    KubePartition,
    KubernetesDemandSource,
    need,
)
from sco.adapters.kubernetes.gangs import gang_of
from sco.decide.hedge import HedgeConfig, plan
from sco.domain.demand import Partition, SchedulerKind
from sco.domain.snapshot import PoolView
from sco_harness.builders import guaranteed_pool, snapshot, spot_pool

pytest.importorskip("kubernetes")  # quantities are read with the client's parser

ALLOCATABLE = {"cpu": "8", "memory": "32Gi", "pods": "110"}
PART = KubePartition(labels={"sco.io/partition": "train"}, allocatable=ALLOCATABLE)
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def worker(
    name: str,
    group: str = "",
    cpu: str = "6",
    created: str = "2026-12-01T00:00:00Z",
    label: str = "sco.io/gang",
    **annotations: str,
) -> dict[str, Any]:
    """A pending pod of `cpu` CPUs (6: one per node), in pod group `group`."""
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {label: group} if group else {},
            "annotations": annotations,
            "creationTimestamp": created,
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]},
    }


def idle_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"sco.io/partition": "train"}},
        "spec": {},
        "status": {"allocatable": ALLOCATABLE, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_pod_group_that_needs_new_nodes_is_a_gang_and_a_lone_pod_is_not() -> None:
    pods = [worker(f"w{i}", "resnet") for i in range(4)] + [worker("solo")]
    n = need(pods, [], PART)
    assert n.new_nodes == 5  # every pod still counts toward the target
    assert [(g.name, g.units, g.whole) for g in n.gangs] == [("ml/resnet", 4, False)]


def test_kueue_and_coscheduling_pod_groups_are_gangs_too() -> None:
    pods = [worker(f"k{i}", "a", label="kueue.x-k8s.io/pod-group-name") for i in range(2)]
    pods += [worker(f"c{i}", "b", label="scheduling.x-k8s.io/pod-group") for i in range(3)]
    assert gang_of(pods[0]) == "ml/a"
    assert sorted((g.name, g.units) for g in need(pods, [], PART).gangs) == [
        ("ml/a", 2),
        ("ml/b", 3),
    ]


def test_a_group_that_fits_one_node_or_the_idle_nodes_needs_no_gang() -> None:
    small = [worker(f"s{i}", "tiny", cpu="2") for i in range(3)]  # 6 CPUs: one node
    assert need(small, [], PART).gangs == ()
    pair = [worker(f"p{i}", "pair") for i in range(2)]
    assert need(pair, [idle_node("n1"), idle_node("n2")], PART).gangs == ()
    assert [g.units for g in need(pair, [idle_node("n1")], PART).gangs] == [2]


def test_the_oldest_group_takes_the_idle_nodes_first() -> None:
    old = [worker(f"o{i}", "old", created="2026-12-01T00:00:00Z") for i in range(2)]
    new = [worker(f"n{i}", "new", created="2026-12-02T00:00:00Z") for i in range(2)]
    nodes = [idle_node("n1"), idle_node("n2")]
    assert [g.name for g in need(new + old, nodes, PART).gangs] == ["ml/new"]


def test_deadline_checkpoint_and_one_pool_affinity_are_read_from_the_pods() -> None:
    pods = [worker(f"w{i}", "job", **{"sco.io/checkpoint": "30m"}) for i in range(3)]
    for p in pods:
        p["spec"]["activeDeadlineSeconds"] = 7200
        p["spec"]["affinity"] = {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"sco.io/gang": "job"}},
                     "topologyKey": "sco.io/pool"}
                ]
            }
        }  # fmt: skip
    (g,) = need(pods, [], PART).gangs
    assert (g.run_s, g.checkpoint_s, g.whole) == (7200.0, 1800.0, True)
    assert g.at_stake_s(0.0) == 1800.0


def test_a_checkpoint_annotation_that_cannot_be_read_is_refused_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = [worker(f"w{i}", "job", **{"sco.io/checkpoint": "often"}) for i in range(2)]
    n = need(pods, [], PART)
    (g,) = n.gangs
    assert g.checkpoint_s is None  # placed as a gang that does not checkpoint
    assert [pod for pod, _ in n.bad_checkpoints] == ["ml/w0", "ml/w1"]
    assert "'sco.io/checkpoint: often': want a duration > 0" in n.bad_checkpoints[0][1]
    source = _source(pods)
    with caplog.at_level(logging.WARNING):
        source.demand("train", 0.0)
        source.demand("train", 1.0)  # told once per pod
    refused = [r for r in caplog.records if "checkpoint declaration is refused" in r.message]
    assert len(refused) == 2
    assert "sco.io/checkpoint: often" in refused[0].getMessage()


class _Listed:
    """What the demand source reads of an informer: listed, reachable, its objects."""

    def __init__(self, name: str, objects: list[dict[str, Any]]) -> None:
        self.name, self._objects = name, objects
        self.synced, self.last_error = True, None

    def items(self) -> list[dict[str, Any]]:
        return self._objects

    def failing_for(self) -> float:
        return 0.0


def _source(pods: list[dict[str, Any]], units_per_node: int = 1) -> KubernetesDemandSource:
    part = Partition("train", "r1", SchedulerKind.KUBERNETES)
    spec = KubeDemandSpec(part, PART, 0, 40, 40, units_per_node=units_per_node)
    return KubernetesDemandSource(_Listed("pods", pods), _Listed("nodes", []), [spec])  # type: ignore[arg-type]


def test_the_demand_carries_gangs_in_units_and_the_planner_keeps_each_in_one_pool() -> None:
    pods = [worker(f"w{i}", "resnet") for i in range(6)]
    demand = _source(pods, units_per_node=2).demand("train", 0.0)
    assert demand.target_units == 12
    assert [(g.name, g.units) for g in demand.gangs] == [("ml/resnet", 12)]
    pools = [spot_pool("hall-1", "a"), spot_pool("hall-2", "b"), spot_pool("hall-3", "c")]
    views = [PoolView(p, headroom=16, up_since=0.0, notice_s=300.0) for p in pools]
    views.append(PoolView(guaranteed_pool("hall-1"), headroom=40))
    placed = plan(snapshot(views, want=demand), HedgeConfig(max_spare=0))
    assert sorted(placed.spot.values()) == [12]  # one pool, not spread over three
    assert any(n.startswith("gang: job ml/resnet (12 units") for n in placed.notes)
