"""A Kubernetes partition through `sco run`: the configuration file, the Nova test
stack whose servers boot into Nodes (`sco_harness.kube_cluster.KubeletSim`, which
also schedules pods), and the test API server (`sco_harness.kube_api`).

Pending pods bring up nodes of the right class, labelled as their servers; pods
no node can run are told so; pods that leave take their nodes with them; an API
server that goes away degrades the partition and deletes nothing; a kubeconfig
that cannot be used stops `sco run` at start with one line.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sco_harness.controlplane import wait_for
from sco_harness.kube_api import KubeApi
from sco_harness.kube_cluster import UNSCHEDULABLE, KubeletSim
from sco_harness.openstack_stack import ROOT, NovaStack, echo, free_port

pytest.importorskip("kubernetes")

ALLOCATABLE = {"cpu": "2", "memory": "4Gi", "pods": "110"}
TOLERATE = [{"key": "sco.io/capacity-class", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    server = KubeApi(bookmark_s=1.0).start()
    yield server
    server.stop()


def _config(tmp: Path, stack: NovaStack, kubeconfig: Path) -> Path:
    region = tmp / "region.yaml"
    region.write_text(yaml.safe_dump(stack.region()))
    doc = {
        "state": {"url": f"sqlite:///{tmp / 'state.sqlite'}"},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region),
            "clouds_file": str(stack.clouds_yaml),
        },
        "kubernetes": {"main": {"kubeconfig": str(kubeconfig), "timeout_s": 3}},
        "partitions": [
            {
                "name": "web",
                "kind": "kubernetes",
                "demand": "kubernetes",
                "floor_units": 0,
                "max_units": 6,
                "kubernetes": {"cluster": "main", "allocatable": ALLOCATABLE, "spot_taint": True},
            }
        ],
        "policy": {
            "interval_s": 1,
            "hedge": {"max_spare": 0},
            "controller": {"list_grace_s": 20, "act": {"drain_s": 20}},
        },
        "http": {"run_port": 0},
    }
    path = tmp / "sco.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _pod(name: str, cpu: str, tolerate: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": "app",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
            }
        ]
    }
    if tolerate:
        spec["tolerations"] = TOLERATE
    return {
        "metadata": {
            "name": name,
            "namespace": "prod",
            "labels": {"app": name.split("-", maxsplit=1)[0]},
        },
        "spec": spec,
        "status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]},
    }


def _running(api: KubeApi) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in api.list("pods")
        if p["status"].get("phase") == "Running"
    }


def _nodes(api: KubeApi) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in api.list("nodes")}


def test_pending_pods_bring_up_labelled_nodes_that_leave_with_them(
    tmp_path: Path, stack: NovaStack, api: KubeApi
) -> None:
    """Four pods that tolerate spot and one that does not wait, with one no node can
    run; `sco run` brings up nodes, the strict pod lands on a guaranteed node, every
    node carries its labels (and spot nodes the taint); the tolerant pods' leaving
    takes their nodes away; then the API server goes, and nothing more is deleted."""
    kubelets = KubeletSim(
        api, lambda: stack.servers(tags="sco"), ALLOCATABLE, spot_taint=True
    ).start()
    for i in range(4):
        api.put("pods", _pod(f"web-{i}", "1"))
    api.put("pods", _pod("db-0", "1", tolerate=False))
    api.put("pods", _pod("huge-0", "4"))
    config = _config(tmp_path, stack, api.kubeconfig(tmp_path / "kubeconfig"))
    log = tmp_path / "run.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config)],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    started = time.monotonic()
    try:
        try:
            wait_for(lambda: len(_running(api)) == 5 or proc.poll() is not None or kubelets.errors,
                     100, "5 pods running")  # fmt: skip
        except AssertionError:
            raise AssertionError(
                str(
                    [
                        (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"])
                        for p in api.list("pods")
                    ]
                )
                + str([(n["metadata"], n["spec"], n["status"]) for n in api.list("nodes")])
                + str(kubelets.booted)
            ) from None
        assert proc.poll() is None, log.read_text()[-3000:]
        assert not kubelets.errors, kubelets.errors[:3]
        up_s = time.monotonic() - started
        running, nodes = _running(api), _nodes(api)
        servers = {s["id"]: s for s in stack.servers(tags="sco")}
        # Only the nodes running pods: an empty one sco found surplus may be on its
        # way out, its server gone before its Node.
        for node in (nodes[name] for name in set(running.values())):
            sid = node["spec"]["providerID"].rsplit("/", 1)[-1]
            assert sid in servers, log.read_text()[-3000:]
            meta = servers[sid]["metadata"]
            labels = node["metadata"]["labels"]
            wait_for(lambda n=node["metadata"]["name"]: "sco.io/pool" in _nodes(api)[n]
                     ["metadata"]["labels"], 20, "sco's labels")  # fmt: skip
            labels = _nodes(api)[node["metadata"]["name"]]["metadata"]["labels"]
            assert labels["sco.io/partition"] == "web"
            assert labels["sco.io/capacity-class"] == meta["sco:class"]
            assert labels["sco.io/pool"] == meta["sco:pool"].replace("/", ".")
            assert labels["topology.kubernetes.io/zone"] == meta["sco:pool"].split("/")[1]
            tainted = bool(node["spec"].get("taints"))
            assert tainted == (meta["sco:class"] == "spot")
        db_node = nodes[running["db-0"]]
        assert db_node["metadata"]["labels"]["sco.io/capacity-class"] == "guaranteed"
        assert len(nodes) <= 4  # four 1-CPU pods on 2-CPU nodes, and db's
        events = api.list("events")
        assert [e["involvedObject"]["name"] for e in events] == ["huge-0"]

        # The tolerant pods finish: their nodes drain, their servers go, so do the Nodes.
        for i in range(4):
            api.delete("pods", "prod", f"web-{i}")
        try:
            wait_for(lambda: set(_nodes(api)) == {running["db-0"]}, 120, "only db's node left")
        except AssertionError:
            left = [(n["metadata"], n["spec"]) for n in _nodes(api).values()]
            raise AssertionError(f"{left}\n{log.read_text()[-4000:]}") from None
        wait_for(lambda: len(stack.servers(tags="sco")) == 1, 60, "only db's server left")
        down_s = time.monotonic() - started - up_s

        # The API server goes: the partition is degraded and nothing is deleted.
        api.stop()
        wait_for(lambda: "degraded" in log.read_text(), 30, "the partition degraded")
        time.sleep(5)
        assert len(stack.servers(tags="sco")) == 1
        assert proc.poll() is None
    finally:
        kubelets.stop()
        proc.terminate()
        proc.wait(timeout=60)
        stack.clear()
    out = log.read_text()
    assert not kubelets.errors, kubelets.errors[:3]
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    echo(f"kubernetes: 5 pods running on {len(nodes)} nodes in {up_s:.1f} s; "
         f"idle nodes gone in {down_s:.1f} s")  # fmt: skip


def test_a_kubeconfig_that_cannot_be_used_stops_sco_run_with_one_line(
    tmp_path: Path, stack: NovaStack, api: KubeApi
) -> None:
    def run(kubeconfig: Path) -> tuple[int, str]:
        config = _config(tmp_path, stack, kubeconfig)
        p = subprocess.run(
            [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config), "--dry-run"],
            capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
        )  # fmt: skip
        return p.returncode, p.stderr

    garbage = tmp_path / "garbage"
    garbage.write_text("clusters: [this is not, a kubeconfig\n")
    code, err = run(garbage)
    assert code == 2, err
    assert err.strip().startswith("sco: error: kubernetes.main.kubeconfig:"), err
    assert len(err.strip().splitlines()) == 1, err

    code, err = run(tmp_path / "missing")
    assert code == 2, err
    assert "kubernetes.main.kubeconfig:" in err, err
    assert len(err.strip().splitlines()) == 1, err

    gone = tmp_path / "gone"
    port = free_port()
    gone.write_text(api.kubeconfig(tmp_path / "k").read_text().replace(
        api.url, f"http://127.0.0.1:{port}"))  # fmt: skip
    code, err = run(gone)
    assert code == 2, err
    assert f"kubernetes.main: cannot reach the API server at http://127.0.0.1:{port}" in err, err
    assert len(err.strip().splitlines()) == 1, err

    # And a working one passes the start checks: the dry run plans from the pods, and
    # writes nothing to the cluster (issue 40: it sent a Warning Event for a pod no
    # node could run).
    api.put("pods", _pod("web-0", "1"))
    api.put("pods", _pod("huge-0", "64"))
    code, err = run(api.kubeconfig(tmp_path / "good"))
    assert code == 0, err
    assert api.list("events") == []
