"""The Kubernetes node plane against the test API server, through the official client:
a node joins by providerID, a drain cordons and evicts, a disruption budget holds an
eviction until a replacement is ready, the deadline deletes what remains, and a pod
sco may not disrupt survives sco's own moves but not a reclaim."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sco.adapters.kubernetes.informer import Informer
from sco.adapters.kubernetes.nodes import DO_NOT_DISRUPT, RECLAIM, KubernetesNodes
from sco.engine.clock import ManualClock
from sco.ports import NodeView
from sco_harness.controlplane import wait_for
from sco_harness.kube_api import KubeApi


def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    wait_for(check, timeout_s, what, every_s=0.02)


def look(nodes: KubernetesNodes, partition: str = "web") -> Mapping[str, NodeView]:
    """One cycle's worth, as the controller does it: the scheduler's work, then a read."""
    listing = nodes._listing
    nodes.tend(partition, listing(partition) if listing is not None else None)
    return nodes.nodes(partition)


pytest.importorskip("kubernetes")

READY = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:10Z"}]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    server = KubeApi(bookmark_s=0.2).start()
    yield server
    server.stop()


@pytest.fixture
def plane(api: KubeApi, tmp_path: Path) -> Iterator[tuple[KubernetesNodes, ManualClock]]:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(str(api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg)
    core = client.CoreV1Api(client.ApiClient(cfg))
    nodes = Informer(core.list_node, watch_timeout_s=5).start()
    pods = Informer(core.list_pod_for_all_namespaces, watch_timeout_s=5).start()
    assert nodes.wait_synced(10)
    assert pods.wait_synced(10)
    clock = ManualClock(1_000.0)
    yield KubernetesNodes(core, nodes, pods, clock, grace_s=30.0), clock
    nodes.stop()
    pods.stop()


def node(name: str, server: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"sco.io/partition": "web"}},
        "spec": {"providerID": f"openstack:///{server}"},
        "status": {"conditions": READY if ready else []},
    }


def pod(name: str, on: str, app: str = "web", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "prod",
            "labels": {"app": app},
            "annotations": annotations,
        },
        "spec": {"nodeName": on, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def budget(min_available: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "web"}}},
    }


def test_a_node_joins_by_provider_id_when_ready(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    nodes, _ = plane
    api.put("nodes", node("n-booting", "srv-1", ready=False))
    api.put("nodes", node("n-ready", "srv-2"))
    api.put("nodes", node("not-ours", ""))
    until(lambda: len(look(nodes)) == 2, "two nodes with provider ids")
    got = look(nodes)
    assert not got["srv-1"].joined
    assert got["srv-2"].joined
    assert got["srv-2"].joined_at == datetime(2026, 12, 1, 0, 0, 10, tzinfo=UTC).timestamp()


def test_a_budget_holds_the_eviction_until_a_replacement_is_ready(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    nodes, clock = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    api.put("pods", pod("web-2", "n2"))
    api.put("poddisruptionbudgets", budget(2))
    until(lambda: "srv-1" in look(nodes), "n1")
    nodes.drain("web", "srv-1", drain_by=2_000.0, reason="over_target")
    until(lambda: api.objects["nodes"][("", "n1")]["spec"].get("unschedulable") is True, "cordon")
    for _ in range(3):  # refused while only two web pods are ready
        assert not look(nodes)["srv-1"].drained
    assert ("prod", "web-1") in api.objects["pods"]
    api.put("pods", pod("web-3", "n3"))  # the replacement is ready
    until(lambda: not look(nodes)["srv-1"].busy, "web-1 evicted", timeout_s=5)
    assert look(nodes)["srv-1"].drained
    assert api.evictions == 1
    assert clock.now() < 2_000.0 - 30.0  # well before the deadline


def test_at_the_deadline_what_remains_is_deleted(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    nodes, clock = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    api.put("poddisruptionbudgets", budget(1))
    until(lambda: "srv-1" in look(nodes), "n1")
    nodes.drain("web", "srv-1", drain_by=1_100.0, reason=RECLAIM)
    look(nodes)
    assert ("prod", "web-1") in api.objects["pods"]  # the budget refuses
    clock.set(1_100.0 - 30.0)  # the grace before the deadline
    until(lambda: look(nodes)["srv-1"].drained, "drained at the deadline")
    assert "pods deleted at the deadline: prod/web-1" in look(nodes)["srv-1"].note
    assert api.evictions == 0


def test_do_not_disrupt_holds_against_sco_but_not_against_a_reclaim(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    nodes, _ = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("nodes", node("n2", "srv-2"))
    api.put("pods", pod("train-1", "n1", app="train", **{DO_NOT_DISRUPT: "true"}))
    api.put("pods", pod("train-2", "n2", app="train", **{DO_NOT_DISRUPT: "true"}))
    until(lambda: len(look(nodes)) == 2, "both nodes")
    nodes.drain("web", "srv-1", drain_by=9_000.0, reason="over_target")
    nodes.drain("web", "srv-2", drain_by=9_000.0, reason=RECLAIM)
    until(lambda: look(nodes)["srv-2"].drained, "the reclaimed node drained")
    moved = look(nodes)["srv-1"]
    assert not moved.drained
    assert f"left alone ({DO_NOT_DISRUPT}): prod/train-1" in moved.note
    assert ("prod", "train-1") in api.objects["pods"]


def test_an_unreachable_api_server_is_unavailable_not_a_crash(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """The controller degrades a partition on SchedulerUnavailable and deletes
    nothing; any other exception would end its cycle."""
    from sco.ports import SchedulerUnavailable

    nodes, _ = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    until(lambda: "srv-1" in look(nodes), "n1")
    nodes.drain("web", "srv-1", drain_by=9_000.0, reason="over_target")
    api.stop()
    with pytest.raises(SchedulerUnavailable, match="kubernetes"):
        look(nodes)
    with pytest.raises(SchedulerUnavailable):
        nodes.drain("web", "srv-1", drain_by=9_000.0)


def test_demand_follows_pending_pods_through_the_informers(api: KubeApi, tmp_path: Path) -> None:
    """The demand source reads its informers: unavailable until they have listed,
    then the nodes the partition needs, within its max; pods no node of it can run
    are reported, not counted."""
    from kubernetes import client, config

    from sco.adapters.kubernetes import demand as kd
    from sco.domain.demand import Partition, SchedulerKind
    from sco.ports import SchedulerUnavailable

    cfg = client.Configuration()
    config.load_kube_config(str(api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg)
    core = client.CoreV1Api(client.ApiClient(cfg))
    pods = Informer(core.list_pod_for_all_namespaces, watch_timeout_s=5)
    nodes = Informer(core.list_node, watch_timeout_s=5)
    kube = kd.KubePartition(
        labels={"sco.io/partition": "web"},
        allocatable={"cpu": "4", "memory": "16Gi", "pods": "110"},
    )
    spec = kd.KubeDemandSpec(Partition("web", "r1", SchedulerKind.KUBERNETES), kube, 1, 6, 6)
    source = kd.KubernetesDemandSource(pods, nodes, [spec], core)
    with pytest.raises(SchedulerUnavailable):
        source.demand("web", 0.0)
    pods.start()
    nodes.start()
    try:
        assert pods.wait_synced(10)
        assert nodes.wait_synced(10)
        assert source.demand("web", 0.0).target_units == 0
        unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        for i, cpu in enumerate(["3"] * 7 + ["8"]):  # one per node; the last fits none
            p = pod(f"web-{i}", on="")
            del p["spec"]["nodeName"]
            p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
            p["status"] = {"phase": "Pending", "conditions": [unschedulable]}
            api.put("pods", p)
        until(lambda: len(pods.items()) == 8, "eight pending pods")
        got = source.demand("web", 0.0)
        assert got.target_units == 6  # seven nodes wanted (not the 8-CPU pod's), max 6
        assert got.floor_units == 1
        assert got.unfit_work == 1
        # The pod that fits no node is told so, once, on the pod itself.
        source.demand("web", 1.0)
        events = list(api.objects["events"].values())
        assert [e["involvedObject"]["name"] for e in events] == ["web-7"]
        assert events[0]["type"] == "Warning"
        assert "requests more than a node" in events[0]["message"]
    finally:
        pods.stop()
        nodes.stop()


def test_a_node_is_labelled_as_its_server_and_goes_when_its_server_does(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """Given the provider's listing, a node that joins gets its partition, class, pool
    and zone labels (and the spot taint where asked); a labelled node whose server
    is no longer listed is deleted; others' nodes are left alone."""
    from sco.adapters.kubernetes.demand import KubePartition
    from sco.domain.pools import CapacityClass, Pool
    from sco.ports import ServerStatus, ServerView

    base, _ = plane
    spot = Pool("lab", "hall-a", "m1", CapacityClass.SPOT, 1, 0.1)
    steady = Pool("lab", "hall-b", "m1", CapacityClass.GUARANTEED, 1, 1.0)
    listed = [
        ServerView("srv-1", "web", spot.id, "r1", 1, ServerStatus.ACTIVE, 0.0),
        ServerView("srv-2", "web", steady.id, "r1", 1, ServerStatus.ACTIVE, 0.0),
    ]
    kube = KubePartition({"sco.io/partition": "web"}, {"cpu": "4"}, spot_taint=True)
    nodes = KubernetesNodes(
        base.core, base._nodes, base._pods, base.clock,
        partitions={"web": kube}, listing=lambda _: list(listed), pools=[spot, steady],
    )  # fmt: skip
    bare = node("n1", "srv-1")
    bare["metadata"]["labels"] = {}  # as a kubelet without sco's flags registers
    api.put("nodes", bare)
    api.put("nodes", node("n2", "srv-2"))
    api.put("nodes", node("theirs", "srv-9"))  # a server of no partition of ours
    until(lambda: len(base._nodes.items()) == 3, "three nodes")
    assert set(look(nodes)) == {"srv-1", "srv-2"}
    n1 = api.objects["nodes"][("", "n1")]
    assert n1["metadata"]["labels"] == {
        "sco.io/partition": "web",
        "sco.io/capacity-class": "spot",
        "sco.io/pool": "lab.hall-a.m1",
        "topology.kubernetes.io/zone": "hall-a",
    }
    assert n1["spec"]["taints"] == [
        {"key": "sco.io/capacity-class", "value": "spot", "effect": "NoSchedule"}
    ]
    n2 = api.objects["nodes"][("", "n2")]
    assert n2["metadata"]["labels"]["sco.io/capacity-class"] == "guaranteed"
    assert not n2["spec"].get("taints")  # guaranteed: never tainted
    version = n1["metadata"]["resourceVersion"]
    until(lambda: base._nodes.get("", "n1") == n1, "the informer saw the labels")
    look(nodes)
    assert api.objects["nodes"][("", "n1")]["metadata"]["resourceVersion"] == version  # no rewrite
    listed.pop(0)  # srv-1 is gone
    until(lambda: set(look(nodes)) == {"srv-2"}, "srv-1 left")
    until(lambda: ("", "n1") not in api.objects["nodes"], "n1's Node deleted")
    assert ("", "theirs") in api.objects["nodes"]


def test_a_node_that_registers_as_its_server_goes_is_deleted_too(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """A kubelet that registers just before its server is deleted leaves a Node sco
    never labelled; sco listed that server for the partition, so the Node is its to
    delete (found by CI on a loaded machine: it stayed for good). A server listed
    more than `REMEMBER_S` ago no longer counts."""
    from sco.adapters.kubernetes.nodes import REMEMBER_S
    from sco.domain.pools import CapacityClass, Pool
    from sco.ports import ServerStatus, ServerView

    base, clock = plane
    spot = Pool("lab", "hall-a", "m1", CapacityClass.SPOT, 1, 0.1)
    listed = [
        ServerView(f"srv-{i}", "web", spot.id, "r1", 1, ServerStatus.ACTIVE, 0.0) for i in (1, 2)
    ]
    nodes = KubernetesNodes(
        base.core, base._nodes, base._pods, clock, listing=lambda _: list(listed), pools=[spot]
    )
    look(nodes)  # both listed, neither a Node yet
    listed.pop(1)  # srv-2 goes first, and long ago by the time its Node shows
    clock.advance(REMEMBER_S + 1)
    look(nodes)
    listed.pop(0)  # srv-1 is gone before its kubelet's Node shows
    look(nodes)
    for name, sid in (("late", "srv-1"), ("stale", "srv-2")):
        bare = node(name, sid)
        bare["metadata"]["labels"] = {}
        api.put("nodes", bare)
    until(lambda: len(base._nodes.items()) == 2, "two nodes")
    until(lambda: not look(nodes) and ("", "late") not in api.objects["nodes"], "late deleted")
    assert ("", "stale") in api.objects["nodes"]


def test_a_pod_sco_may_not_disrupt_pins_its_node(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    nodes, _ = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("nodes", node("n2", "srv-2"))
    api.put("pods", pod("train-1", "n1", app="train", **{DO_NOT_DISRUPT: "true"}))
    api.put("pods", pod("web-1", "n2"))
    until(lambda: len(nodes._pods.items()) == 2 and len(look(nodes)) == 2, "both")
    got = look(nodes)
    assert got["srv-1"].pinned
    assert not got["srv-2"].pinned
    assert got["srv-2"].busy


def test_a_drain_shorter_than_the_grace_evicts_before_it_deletes(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """Regression: with a 20 s drain and a 30 s grace every pod was deleted at once;
    now half the drain's time goes to evictions (which a budget may hold)."""
    nodes, clock = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    api.put("poddisruptionbudgets", budget(1))
    until(lambda: "srv-1" in look(nodes), "n1")
    nodes.drain("web", "srv-1", drain_by=clock.now() + 20.0, reason="over_target")
    look(nodes)
    assert ("prod", "web-1") in api.objects["pods"]  # held by the budget, not deleted
    clock.advance(10.0)
    until(lambda: look(nodes)["srv-1"].drained, "deleted half way to the deadline")


def test_a_restarted_sco_goes_on_with_the_drains_it_began(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """The deadline and reason live on the Node: a new process reads them back, and
    evicts, then deletes at the deadline, as the first would have."""
    nodes, clock = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    api.put("poddisruptionbudgets", budget(1))
    until(lambda: "srv-1" in look(nodes), "n1")
    nodes.drain("web", "srv-1", drain_by=1_100.0, reason=RECLAIM)
    notes = api.objects["nodes"][("", "n1")]["metadata"]["annotations"]
    assert notes == {"sco.io/drain-by": "1100.000", "sco.io/drain-reason": RECLAIM}
    again = KubernetesNodes(nodes.core, nodes._nodes, nodes._pods, clock, grace_s=30.0)
    until(lambda: again._nodes.get("", "n1")["metadata"].get("annotations"), "the informer")
    assert not look(again)["srv-1"].drained  # the budget holds the eviction
    clock.set(1_070.0)
    until(lambda: look(again)["srv-1"].drained, "deleted at the deadline's grace")
    assert "pods deleted at the deadline: prod/web-1" in look(again)["srv-1"].note


def test_reading_nodes_evicts_and_deletes_nothing(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """Defect 2 of issue 25: a dry run reads the node plane, and reading evicted pods."""
    nodes, clock = plane
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("web-1", "n1"))
    until(lambda: "srv-1" in nodes.nodes("web"), "n1")
    nodes.drain("web", "srv-1", drain_by=clock.now() + 60.0, reason=RECLAIM)
    until(lambda: bool(nodes.nodes("web")["srv-1"].leaving), "the informer saw the cordon")
    clock.advance(120.0)  # past the deadline: what remains is due to be deleted
    for _ in range(3):
        got = nodes.nodes("web")["srv-1"]
    assert ("prod", "web-1") in api.objects["pods"]
    assert got.busy
    assert not got.drained
    assert got.reclaim_by == 1_060.0
    until(lambda: look(nodes)["srv-1"].drained, "the leader's cycle deletes it")


def _labelled(name: str, server: str, **labels: str) -> dict[str, Any]:
    n = node(name, server)
    n["metadata"]["labels"] = {"sco.io/pool": "lab.hall-a.m1", **labels}
    return n


def test_another_installation_s_nodes_are_never_ours(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """Issue 40, defect 1: installation `default`'s partition `web` took a Node of
    installation `b`'s `web` as its own, its labels being a subset of the other's, and
    deleted it as gone; custom labels dropped the installation label. A node is a
    partition's only when it is of its installation too."""
    from sco.adapters.kubernetes.demand import KubePartition

    base, _ = plane
    mine = KubernetesNodes(
        base.core, base._nodes, base._pods, base.clock,
        partitions={"web": KubePartition({"sco.io/partition": "web"}, {"cpu": "4"})},
        listing=lambda _: [],
    )  # fmt: skip
    theirs = KubePartition({"team": "ml"}, {"cpu": "4"}, installation="b")
    assert theirs.identity() == {"team": "ml", "sco.io/installation": "b"}
    api.put("nodes", _labelled("b-1", "srv-b1", **{"sco.io/partition": "web"},
                               **{"sco.io/installation": "b"}))  # fmt: skip
    api.put("nodes", _labelled("b-2", "srv-b2", team="ml", **{"sco.io/installation": "b"}))
    api.put("nodes", _labelled("old", "srv-0", **{"sco.io/partition": "web"}))
    until(lambda: len(base._nodes.items()) == 3, "three nodes")
    look(mine)
    until(lambda: ("", "old") not in api.objects["nodes"], "default's own gone Node deleted")
    assert {("", "b-1"), ("", "b-2")} <= set(api.objects["nodes"])
    b_nodes = KubernetesNodes(
        base.core, base._nodes, base._pods, base.clock,
        partitions={"ml": theirs}, listing=lambda _: [],
    )  # fmt: skip
    look(b_nodes, "ml")
    until(lambda: ("", "b-2") not in api.objects["nodes"], "b's own gone Node deleted")
    assert ("", "b-1") in api.objects["nodes"]  # b's, but not partition ml's


def test_two_partitions_one_node_could_serve_are_refused() -> None:
    """Overlapping labels in one cluster: each would count and delete the other's."""
    from sco.adapters.kubernetes.demand import KubePartition

    a = KubePartition({"team": "ml"}, {"cpu": "4"})
    assert a.overlaps(KubePartition({"gpu": "yes"}, {"cpu": "4"}))
    assert a.overlaps(KubePartition({"team": "ml", "gpu": "yes"}, {"cpu": "4"}))
    assert not a.overlaps(KubePartition({"team": "web"}, {"cpu": "4"}))
    assert not a.overlaps(KubePartition({"team": "ml"}, {"cpu": "4"}, installation="b"))


def test_tending_a_partition_leaves_others_drains_alone(
    api: KubeApi, plane: tuple[KubernetesNodes, ManualClock]
) -> None:
    """Issue 40, defect 2: `tend(p, None)` (the cloud away, or a reclaim's drain)
    resumed and advanced every cordoned Node carrying `sco.io/drain-by` in the
    cluster, other partitions' and other installations' too."""
    nodes, clock = plane
    theirs = _labelled("n9", "srv-9", **{"sco.io/partition": "db"})
    theirs["metadata"]["annotations"] = {"sco.io/drain-by": "1001.000",
                                         "sco.io/drain-reason": RECLAIM}  # fmt: skip
    theirs["spec"]["unschedulable"] = True
    api.put("nodes", theirs)
    api.put("nodes", node("n1", "srv-1"))
    api.put("pods", pod("db-1", "n9", app="db"))
    until(lambda: len(nodes._nodes.items()) == 2 and nodes._pods.items(), "the informers")
    clock.set(2_000.0)  # long past the other drain's deadline
    nodes.tend("web", None)
    nodes.nodes("web")
    assert ("prod", "db-1") in api.objects["pods"]  # not evicted, not deleted
    assert "srv-9" not in nodes._drains
    nodes.tend("db", None)  # its own partition's leader goes on with it
    until(lambda: ("prod", "db-1") not in api.objects["pods"], "db's own drain went on")


def test_a_configuration_whose_partitions_share_nodes_stops_at_start(tmp_path: Path) -> None:
    """Refused before the cluster is even asked, naming both partitions; and the
    installation label is `installation`'s, not a partition's to set."""
    import yaml

    from sco.assembly.planes import scheduler_plane
    from sco.assembly.settings import load
    from sco.assembly.wiring import StartError

    def partition(name: str, labels: dict[str, str]) -> dict[str, Any]:
        kube = {"cluster": "main", "allocatable": {"cpu": "4", "memory": "8Gi"}, "labels": labels}
        return {"name": name, "kind": "kubernetes", "demand": "kubernetes",
                "floor_units": 0, "max_units": 2, "kubernetes": kube}  # fmt: skip

    def settings(*parts: dict[str, Any]) -> Any:
        path = tmp_path / "sco.yaml"
        path.write_text(yaml.safe_dump({"kubernetes": {"main": {}}, "partitions": list(parts)}))
        return load(path)

    both = settings(partition("web", {"team": "ml"}), partition("gpu", {"accel": "yes"}))
    said = r"partitions\.gpu\.kubernetes\.labels and partitions\.web\.kubernetes\.labels"
    with pytest.raises(StartError, match=said + r" \(cluster 'main'\): one node could carry"):
        scheduler_plane(both, "r1", 0.0, lambda _: [], ManualClock(0.0))
    with pytest.raises(Exception, match=r"sco\.io/installation is set from `installation`"):
        settings(partition("web", {"sco.io/installation": "b"}))
