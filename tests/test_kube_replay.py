"""Kubernetes workloads replayed: the YAML format's rules, the lab's cluster (requests,
node selectors, a drain's evictions keep a job pod's work, a node gone loses it),
and `sco replay` on pods through sco's own Kubernetes intake and node plane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sco.adapters.kubernetes.pods import CLASS_LABEL, PARTITION_LABEL
from sco.apps.cli import cli
from sco.apps.common import bundled
from sco.engine.clock import ManualClock
from sco.lab.workload.kubecluster import KubeCluster
from sco.lab.workload.kubefile import PodWork, read_kube_workload
from sco.lab.workload.replay import ReplaySpec, replay
from sco.lab.workload.swf import WorkloadError

TRACES = bundled("traces", "apache", "v100-9zone")
NODE = {"cpu": "4", "memory": "8Gi", "pods": "110"}


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_format_expands_services_and_jobs_and_counts_what_it_leaves_out(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        {
            "node": NODE,
            "workloads": [
                {"name": "web", "service": {"replicas": 2}, "cpu": "1", "memory": "1Gi"},
                {"name": "big", "job": {"pods": 3, "run_s": 60}, "cpu": "8", "memory": "1Gi"},
                {
                    "name": "hourly",
                    "job": {"pods": 2, "run_s": 600},
                    "cpu": "500m",
                    "memory": "512Mi",
                    "every_s": 3600,
                    "stop_s": 4 * 3600,
                },
            ],
        },
    )
    w = read_kube_workload(path, days=3 * 3600 / 86400)
    assert w.summary() == {
        "workloads_read": 3,
        "pods_kept": 2 + 3 * 2,
        "job_pods": 6,
        "service_replicas": 2,
        "larger_than_node": 1,
    }
    assert [p.start_s for p in w.pods if p.workload == "hourly"] == [0, 0, 3600, 3600, 7200, 7200]
    assert w.max_nodes == 1, "2 + 1 CPUs at the peak fit one 4-CPU node"
    assert read_kube_workload(path, max_nodes=7).max_nodes == 7


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"name": "a", "cpu": "1", "memory": "1Gi"}, "give one of service or job"),
        ({"name": "a", "job": {"pods": 1, "run_s": 1}, "cpu": "x", "memory": "1"}, "cpu"),
        ({"name": "A b", "service": {"replicas": 1}, "cpu": "1", "memory": "1"}, "name"),
        ({"name": "a", "service": {"replicas": 1}, "cpu": "1", "memory": "1", "gpu": 1}, "gpu"),
        ({"name": "a", "service": {"replicas": 0}, "cpu": "1", "memory": "1"}, "replicas"),
    ],
)
def test_a_bad_workload_names_its_field(
    tmp_path: Path, entry: dict[str, object], said: str
) -> None:
    path = write(tmp_path, {"node": NODE, "workloads": [entry]})
    with pytest.raises(WorkloadError, match=said):
        read_kube_workload(path)


def cluster(clock: ManualClock, nodes: int) -> KubeCluster:
    c = KubeCluster({PARTITION_LABEL: "apps"}, dict(NODE), clock.now)
    for k in range(nodes):
        c.register(f"n{k}", f"s{k}", {CLASS_LABEL: "spot"})
    return c


def pod(key: str, cpu: str, run_s: float | None = 600.0, guaranteed: bool = False) -> PodWork:
    return PodWork(key, key.split("/", maxsplit=1)[0], 0.0, cpu, "1Gi", run_s, None, guaranteed)


def test_pods_bind_by_requests_and_selectors_and_the_rest_are_unschedulable() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 1)
    for w in (pod("a/0", "3"), pod("b/0", "2"), pod("c/0", "1"), pod("g/0", "1", guaranteed=True)):
        c.submit(w)
    c.step()
    on = {x.work.key: x.node for x in c.ledger.values()}
    assert on == {"a/0": "n0", "b/0": "", "c/0": "n0", "g/0": ""}
    waiting = [p for p in c.pods.values() if not p["spec"].get("nodeName")]
    assert all(p["status"]["conditions"][0]["reason"] == "Unschedulable" for p in waiting)
    c.register("n9", "s9", {CLASS_LABEL: "guaranteed"})
    c.step()
    assert c.ledger["g/0"].node == "n9"


def test_an_eviction_keeps_a_job_pods_work_and_a_lost_node_loses_it() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 2)
    c.submit(pod("a/0", "4"))
    c.submit(pod("b/0", "4"))
    c.step()
    a, b = c.ledger["a/0"], c.ledger["b/0"]
    clock.set(200.0)
    c.create_namespaced_pod_eviction(a.pod, "work", {})  # sco's drain, told in time
    c.server_gone(b.node)  # no word
    assert (a.done_s, a.lost_s, a.restarts, a.state) == (200.0, 0.0, 1, "Pending")
    assert (b.done_s, b.lost_s, b.restarts, b.state) == (0.0, 200.0, 1, "Pending")
    assert c.lost == [(200.0, 200.0)], "a whole node's pod: 200 node-seconds"
    c.step()
    assert a.node == "n0", "the new pod runs on the node left"
    clock.set(200.0 + 400.0)
    c.step()
    assert (a.state, a.ended_at) == ("Succeeded", 600.0)
    # n0: 600 s up, n1: 200 s until its server went; busy 200 (a) + 200 (b) + 400 (a)
    assert c.utilisation(600.0) == pytest.approx(800.0 / 800.0)


def test_a_service_replica_runs_until_its_stop_and_counts_its_time_up() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 1)
    c.submit(PodWork("web/0", "web", 0.0, "1", "1Gi", None, 500.0))
    c.step()
    assert c.next_event_time() == 500.0
    clock.set(500.0)
    c.step()
    x = c.ledger["web/0"]
    assert (x.state, x.ran_s) == ("Stopped", 500.0)
    assert not c.pods


@pytest.fixture(scope="module")
def kube_day() -> Path:
    return bundled("workloads", "kube-2d.yaml")


def test_sco_replays_pods_through_its_intake_losing_no_work(kube_day: Path) -> None:
    spec = ReplaySpec(kube_day, TRACES, days=1, pool_size=16, notice_s=120.0)
    _, runs, about = replay(spec, ["sco", "spot-requeue", "static-guaranteed"])
    got = {r.policy: r.outcomes for r in runs}
    assert about["workload"]["job_pods"] == got["sco"]["jobs_submitted"] > 100
    sco, spot, static = got["sco"], got["spot-requeue"], got["static-guaranteed"]
    for name, o in got.items():
        assert o["jobs_completed"] + o["jobs_unfinished"] == o["jobs_submitted"], name
        assert o["jobs_completed"] > 0.9 * o["jobs_submitted"], name
        assert 0.0 <= (o["service_unavailable_share"] or 0.0) < 0.05, name
    assert sco["reclaims"] > 0
    assert sco["requeues"] > 0
    assert sco["lost_node_hours"] == 0.0, "drained in time: evicted pods keep their work"
    assert spot["lost_node_hours"] > 0.0
    assert static["fixed_nodes"] is not None
    assert static["reclaims"] == 0
    assert sco["cost"] < static["cost"]
    assert sco["utilisation"] > static["utilisation"]


def test_the_command_replays_a_kube_workload_to_one_json_line(kube_day: Path) -> None:
    out = CliRunner().invoke(
        cli,
        ["replay", "--workload", str(kube_day), "--days", "0.25", "--policies", "sco", "--json"],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output.strip().splitlines()[-1])
    sco = doc["policies"]["sco"]
    assert {"service_unavailable_share", "lost_pod_hours", "wait_p95_s"} <= set(sco)
    assert doc["workload"]["service_replicas"] > 0


def test_a_bad_kube_workload_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, {"node": {"cpu": "4"}, "workloads": []})
    out = CliRunner().invoke(cli, ["replay", "--workload", str(path)])
    assert out.exit_code == 2, out.output
    assert "node" in out.output
