"""Partition leases on Kubernetes: what only the Kubernetes adapter does. The lease
rules every implementation keeps are in tests/conformance/test_leases.py, this adapter
there over real HTTP to the test API server (`sco_harness.kube_api.KubeApi`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sco.adapters.kubernetes.leases import connect, lease_name
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco_harness.kube_api import KubeApi


def test_lease_names_are_dns_labels() -> None:
    assert lease_name("Batch_GPU.1") == "sco-batch-gpu-1"


def test_a_replica_name_another_process_holds_is_refused(tmp_path: Path) -> None:
    """A replica's heartbeat is a Lease it alone renews: a second process started
    under the same name is told so, rather than both counting as one replica."""
    api = KubeApi().start()
    try:
        leases = connect("sco", str(api.kubeconfig(tmp_path / "kubeconfig")))
        leases.heartbeat("b", 5, now=100)

        def taken(lease: dict[str, Any]) -> dict[str, Any]:
            lease["spec"]["holderIdentity"] = "someone-else"
            return lease

        api.update("leases", "sco", "sco-replica-b", taken)
        with pytest.raises(RuntimeError, match="held by another"):
            leases.heartbeat("b", 5, now=101)
        leases.api.api_client.close()
    finally:
        api.stop()


def test_leases_kubernetes_in_sco_yaml_reach_an_api_server(tmp_path: Path) -> None:
    """`leases: {kind: kubernetes}` builds the adapter from a kubeconfig and speaks HTTP
    to the API server through the official client: replicas share partitions."""
    from sco.assembly.settings import load
    from sco.assembly.wiring import open_leases
    from sco_harness.builders import write_yaml

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
