"""List-and-watch through the official client against the test API server: the cache
follows adds, changes and deletes, bookmarks move its version, an expired version
lists again without missing a pod, and a broken server is retried."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sco.adapters.kubernetes.informer import Informer
from sco_harness.controlplane import wait_for
from sco_harness.kube_api import KubeApi


def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    wait_for(check, timeout_s, what, every_s=0.02)


pytest.importorskip("kubernetes")


@pytest.fixture
def api() -> Iterator[KubeApi]:
    server = KubeApi(bookmark_s=0.2).start()
    yield server
    server.stop()


def core(api: KubeApi, tmp_path: Path) -> Any:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(str(api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def pod(name: str, ns: str = "work", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Pending"},
    }


def names(inf: Informer) -> set[str]:
    return {o["metadata"]["name"] for o in inf.items()}


def test_the_cache_follows_the_server(api: KubeApi, tmp_path: Path) -> None:
    api.put("pods", pod("a"))
    inf = Informer(core(api, tmp_path).list_pod_for_all_namespaces, watch_timeout_s=5).start()
    try:
        assert inf.wait_synced(10)
        assert names(inf) == {"a"}
        api.put("pods", pod("b"))
        changed = pod("a")
        changed["status"]["phase"] = "Running"
        api.put("pods", changed)
        api.delete("pods", "work", "b")
        api.put("pods", pod("c", ns="other"))
        until(lambda: names(inf) == {"a", "c"}, "a and c only")
        a = inf.get("work", "a")
        assert a is not None
        assert a["status"]["phase"] == "Running"
        assert inf.lists == 1
    finally:
        inf.stop()


def test_bookmarks_move_the_version_of_a_quiet_watch(api: KubeApi, tmp_path: Path) -> None:
    """Watching only pods labelled app=web, the informer hears of nothing else, yet its
    version follows the server's through bookmarks."""
    inf = Informer(
        core(api, tmp_path).list_pod_for_all_namespaces, label_selector="app=web", watch_timeout_s=5
    ).start()
    try:
        assert inf.wait_synced(10)
        for i in range(5):
            api.put("pods", pod(f"db{i}", app="db"))
        until(lambda: inf.resource_version == str(api.version), "a bookmark at the head")
        assert inf.items() == []
        api.put("pods", pod("w", app="web"))
        until(lambda: names(inf) == {"w"}, "the web pod")
    finally:
        inf.stop()


def test_an_expired_version_lists_again_without_missing_a_pod(api: KubeApi, tmp_path: Path) -> None:
    """While its watch hears nothing, pods come and go and the server compacts its
    history and drops its watches (a restart): the informer's version is gone (410),
    so it lists again, and its cache is the server's exactly."""
    for i in range(3):
        api.put("pods", pod(f"p{i}"))
    inf = Informer(core(api, tmp_path).list_pod_for_all_namespaces, watch_timeout_s=30).start()
    try:
        assert inf.wait_synced(10)
        until(lambda: names(inf) == {"p0", "p1", "p2"}, "the first three")
        api.pause_watches()
        api.delete("pods", "work", "p0")
        for i in range(3, 8):
            api.put("pods", pod(f"p{i}"))
        api.expire()
        api.resume_watches()
        until(lambda: inf.lists == 2, "a second list after 410 Gone")
        until(lambda: names(inf) == {f"p{i}" for i in range(1, 8)}, "every pod, p0 gone")
        api.put("pods", pod("late"))
        until(lambda: "late" in names(inf), "the watch resumed after the list")
    finally:
        inf.stop()


def test_an_unreachable_server_is_retried_with_backoff(api: KubeApi, tmp_path: Path) -> None:
    v1 = core(api, tmp_path)
    api.stop()
    inf = Informer(v1.list_node, min_backoff_s=0.05, max_backoff_s=0.2).start()
    try:
        until(lambda: inf.errors >= 3, "three failed attempts")
        assert not inf.synced
        assert inf.last_error
    finally:
        inf.stop()


def test_the_test_server_refuses_what_the_schema_refuses(api: KubeApi, tmp_path: Path) -> None:
    """Objects are checked against the Kubernetes OpenAPI schema (strict), through the
    client (422 Invalid) and when a test writes one directly."""
    from kubernetes.client.exceptions import ApiException

    v1 = core(api, tmp_path)
    with pytest.raises(ApiException) as refused:
        v1.patch_node("n1", {"spec": {"unschedulable": "yes"}})
    assert refused.value.status == 404  # no such node yet
    api.put("nodes", {"metadata": {"name": "n1"}, "spec": {}})
    with pytest.raises(ApiException) as invalid:
        v1.patch_node("n1", {"spec": {"unschedulable": "yes"}})
    assert invalid.value.status == 422
    assert "not of type 'boolean'" in invalid.value.body
    with pytest.raises(ValueError, match="containers"):
        api.put("pods", {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}})
