"""Partition leases on Kubernetes Leases, through the official client's models.

No Kubernetes API server installs from this machine's registries, so the
CoordinationV1Api here is an in-memory stand-in that keeps the API server's
one rule that matters: a replace must carry the current resourceVersion, or
it is refused with 409. The adapter, the models and the errors are the real
client's.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import V1Lease, V1LeaseList
from kubernetes.client.exceptions import ApiException

from sco.adapters.kubernetes.leases import KubernetesLeases, lease_name
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.instances import created
from sco.domain.lifecycle import State
from sco.ports import FencedOut, Lease
from sco_harness.builders import instance, spot_pool


class FakeCoordination:
    def __init__(self) -> None:
        self.leases: dict[str, V1Lease] = {}
        self.version = 0
        self.lock = threading.Lock()

    def read_namespaced_lease(self, name: str, namespace: str) -> V1Lease:
        with self.lock:
            if name not in self.leases:
                raise ApiException(status=404, reason="Not Found")
            return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: V1Lease) -> V1Lease:
        with self.lock:
            if body.metadata.name in self.leases:
                raise ApiException(status=409, reason="AlreadyExists")
            self.version += 1
            body = copy.deepcopy(body)
            body.metadata.resource_version = str(self.version)
            self.leases[body.metadata.name] = body
            return body

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease) -> V1Lease:
        with self.lock:
            stored = self.leases.get(name)
            if stored is None:
                raise ApiException(status=404, reason="Not Found")
            if body.metadata.resource_version != stored.metadata.resource_version:
                raise ApiException(status=409, reason="Conflict")
            self.version += 1
            body = copy.deepcopy(body)
            body.metadata.resource_version = str(self.version)
            self.leases[name] = body
            return body

    def list_namespaced_lease(self, namespace: str) -> V1LeaseList:
        with self.lock:
            return V1LeaseList(items=[copy.deepcopy(x) for x in self.leases.values()])

    def delete_namespaced_lease(self, name: str, namespace: str) -> Any:
        with self.lock:
            if self.leases.pop(name, None) is None:
                raise ApiException(status=404, reason="Not Found")


def test_lease_names_are_dns_labels() -> None:
    assert lease_name("Batch_GPU.1") == "sco-batch-gpu-1"


def test_one_holder_and_growing_tokens() -> None:
    leases = KubernetesLeases(FakeCoordination(), "sco")
    a = leases.acquire("p1", "alpha", 15, now=100)
    assert a == Lease("p1", "alpha", 1, 115)
    assert leases.acquire("p1", "beta", 15, now=110) is None
    assert leases.renew(a, 15, now=112) == Lease("p1", "alpha", 1, 127)
    b = leases.acquire("p1", "beta", 15, now=128)
    assert b == Lease("p1", "beta", 2, 143)
    assert leases.renew(a, 15, now=129) is None
    leases.release(b)
    c = leases.acquire("p1", "alpha", 15, now=130)
    assert c is not None
    assert c.token == 3
    assert [x.partition for x in leases.leases()] == ["p1"]


def test_racing_replicas_one_wins() -> None:
    api = FakeCoordination()
    leases = KubernetesLeases(api, "sco")
    leases.acquire("p1", "old", 15, now=0)  # expired by now=100
    start = threading.Barrier(6)
    won: list[Lease] = []

    def race(name: str) -> None:
        start.wait()
        got = KubernetesLeases(api, "sco").acquire("p1", name, 15, now=100)
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=race, args=(f"r{i}",)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(won) == 1
    assert won[0].token == 2


def test_membership() -> None:
    leases = KubernetesLeases(FakeCoordination(), "sco")
    leases.heartbeat("a", 5, now=100)
    leases.heartbeat("b", 5, now=100)
    leases.heartbeat("a", 5, now=104)
    assert leases.live_replicas(now=106) == ["a"]
    leases.forget_replica("a")
    assert leases.live_replicas(now=106) == []
    # another live process already uses the name "b"
    api = leases.api
    assert isinstance(api, FakeCoordination)
    api.leases["sco-replica-b"].spec.holder_identity = "someone-else"
    with pytest.raises(RuntimeError, match="held by another"):
        leases.heartbeat("b", 5, now=101)


def test_the_database_fences_tokens_taken_on_kubernetes(tmp_path: Path) -> None:
    store = SqlFleetStore(sqlite_url(tmp_path / "fleet.db"))
    pool = spot_pool(zone="a")
    store.upsert_pools([pool])
    leases = KubernetesLeases(FakeCoordination(), "sco")
    old = leases.acquire("p1", "old", 15, now=0)
    assert old is not None
    fencing = SqlLeases(store.engine)
    old_fence = fencing.claim_fence("p1", "old", old.token)
    assert old_fence == old.token
    store.record(
        [created(instance(pool, State.ACTIVE, partition_name="p1"), "ok")], fence=old_fence
    )
    new = leases.acquire("p1", "new", 15, now=100)
    assert new is not None
    assert fencing.claim_fence("p1", "new", new.token) == new.token
    stale = created(instance(pool, State.ACTIVE, partition_name="p1"), "stale")
    with pytest.raises(FencedOut):
        store.record([stale], fence=old_fence)
    store.close()


def test_a_lease_that_counts_from_one_again_writes_above_what_the_database_saw(
    tmp_path: Path,
) -> None:
    """Defect 4 of issue 25: a new Kubernetes Lease (recreated, or leases moved from
    the database to Kubernetes) starts at token 1 while the database keeps the largest
    token it saw: every write was refused, and the partition stalled silently."""
    store = SqlFleetStore(sqlite_url(tmp_path / "fleet.db"))
    pool = spot_pool(zone="a")
    store.upsert_pools([pool])
    fencing = SqlLeases(store.engine)
    for token in (1, 2, 7):  # the database-kept leases counted to 7
        fencing.claim_fence("p1", f"db-{token}", token)
    stale = FakeCoordination()
    leases = KubernetesLeases(stale, "sco")
    lease = leases.acquire("p1", "r1", 15, now=0)
    assert lease is not None
    assert lease.token == 1
    fence = fencing.claim_fence("p1", "r1", lease.token)
    assert fence == 8, "above everything the database refused nothing for"
    store.record([created(instance(pool, State.ACTIVE, partition_name="p1"), "ok")], fence=fence)
    assert fencing.claim_fence("p1", "r1", lease.token) == 8, "its own claim, kept"
    del stale.leases["sco-p1"]  # the Lease is recreated: it counts from 1 again
    other = leases.acquire("p1", "r2", 15, now=1)
    assert other is not None
    assert other.token == 1
    assert fencing.claim_fence("p1", "r2", other.token) == 9
    stale = created(instance(pool, State.ACTIVE, partition_name="p1"), "stale")
    with pytest.raises(FencedOut):  # r1 is an older holder now: refused
        store.record([stale], fence=fence)
    store.close()


def test_leases_kubernetes_in_sco_yaml_reach_an_api_server(tmp_path: Path) -> None:
    """`leases: {kind: kubernetes}` builds the adapter from a kubeconfig and speaks HTTP
    to the API server through the official client: replicas share partitions."""
    from sco.assembly.settings import load
    from sco.assembly.wiring import open_leases
    from sco_harness.builders import write_yaml
    from sco_harness.kube_api import KubeApi

    api = KubeApi().start()
    try:
        config = write_yaml(
            tmp_path / "sco.yaml",
            {
                "leases": {
                    "kind": "kubernetes",
                    "kubernetes": {"namespace": "sco-system", "kubeconfig": "kubeconfig"},
                }
            },
        )
        api.kubeconfig(tmp_path / "kubeconfig")
        settings = load(config)
        store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
        a, b = open_leases(settings, store), open_leases(settings, store)
        first = a.acquire("p1", "ra", 15.0, 100.0)
        assert first is not None
        assert b.acquire("p1", "rb", 15.0, 101.0) is None, "held by ra"
        assert b.acquire("p1", "rb", 15.0, 116.0).token > first.token  # expired: taken over
        a.heartbeat("ra", 5.0, 100.0)
        b.heartbeat("rb", 5.0, 100.0)
        assert sorted(b.live_replicas(101.0)) == ["ra", "rb"]
        assert ("sco-system", "sco-p1") in api.objects["leases"]
        assert api.requests > 5
        store.close()
    finally:
        api.stop()
