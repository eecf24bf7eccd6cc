"""Slurm partitions against real daemons: slurmctld and a slurmd per node (each in a
network namespace), munge, and the Nova test stack whose servers "boot" into Slurm
nodes as their cloud-init would (`sco_harness.slurm_cluster.SlurmBoot`).

Jobs are `sbatch` jobs that sleep and then write their id to a file: a job lost or
killed never writes it; a requeued one writes it once, when it finally completes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from sco.adapters.openstack import CloudsYamlSecrets, open_provider
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.provider import OpenStackProvider
from sco.adapters.openstack.resources import META_RECLAIM_AT
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.assembly.planes import scheduler_plane
from sco.assembly.settings import load
from sco.decide.acquirer import ActConfig
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.contracts import Contract, NodeState, Terms
from sco.domain.lifecycle import Timeouts
from sco.engine.clock import SystemClock
from sco.engine.cycle import ControllerConfig
from sco_harness.chaos import audit
from sco_harness.controlplane import wait_for
from sco_harness.openstack_stack import ROOT, NovaStack, echo, free_port
from sco_harness.runners import Rounds, ports_of, rounds_of
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster

CLOUD = "sco-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = SlurmCluster(
        tmp_path_factory.mktemp("slurm"), partitions=("batch",), sco_partition="hpc",
        accounting=True,
    )  # fmt: skip
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def boot(stack: NovaStack, cluster: SlurmCluster) -> Iterator[SlurmBoot]:
    b = SlurmBoot(cluster, lambda: stack.servers(tags="sco")).start()
    yield b
    b.stop()
    cluster.start_ctld()  # a test that failed with it stopped fails alone
    stack.clear()  # clean: every server deleted, every node gone
    b.step()
    for name in list(cluster.nodes):
        cluster.remove_node(name)
    subprocess.run(
        ["scancel", "--partition", "batch"], env=cluster.env, capture_output=True, check=False
    )
    for name in cluster.node_states():  # what a controller would delete, between tests
        if name.startswith("sco-") and not name.startswith("sco-hpc-"):
            subprocess.run(
                ["scontrol", "delete", f"nodename={name}"], env=cluster.env,
                capture_output=True, check=False,
            )  # fmt: skip


def _config(tmp: Path, stack: NovaStack, cluster: SlurmCluster, **part: Any) -> Path:
    region = tmp / "region.yaml"
    region.write_text(yaml.safe_dump(stack.region()))
    slurm = {
        "cluster": "main",
        "partitions": ["batch"],
        "cpus": cluster.cpus,
        "memory_mb": cluster.memory_mb,
        "requeue_lead_s": 10,
        "idle_keep_s": 20,
    }
    config = {
        "state": {"url": f"sqlite:///{tmp / 'state.sqlite'}"},
        "provider": {
            "cloud": CLOUD,
            "region_file": str(region),
            "clouds_file": str(stack.clouds_yaml),
        },
        "slurm": {"main": {"conf": str(cluster.conf), "cache_s": 0.5, "timeout_s": 5}},
        "partitions": [
            {
                "name": "hpc",
                "kind": "slurm",
                "demand": "slurm",
                "floor_units": 0,
                "max_units": 8,
                "slurm": slurm,
                **part,
            }
        ],
        "policy": {"interval_s": 1},
        "http": {"run_port": 0},
    }
    path = tmp / "sco.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _runner(
    tmp: Path, stack: NovaStack, cluster: SlurmCluster, timeouts: Timeouts | None = None
) -> tuple[Rounds, OpenStackProvider]:
    settings = load(_config(tmp, stack, cluster))
    region = RegionSpec.model_validate(stack.region())
    clouds = str(stack.clouds_yaml)
    provider = open_provider(region, CLOUD, CloudsYamlSecrets(), SystemClock(), clouds)
    provider.discover()
    provider.refresh()
    clock = SystemClock()
    plane = scheduler_plane(settings, "lab", clock.now(), provider.last_listing, clock)
    store = SqlFleetStore(settings.state.url)
    runner = rounds_of(
        ports_of(provider, plane.nodes, store, plane.demand, clock),
        lambda: ScoPolicy(HedgeConfig(max_spare=0)),
        ControllerConfig(
            list_grace_s=10,
            act=ActConfig(timeouts=timeouts or Timeouts(), drain_s=600),
        ),
    )
    return runner, provider


def _rounds(
    runner: Rounds,
    provider: OpenStackProvider,
    done: Callable[[], Any],
    timeout_s: float,
    what: str,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        provider.refresh()
        runner.round()
        time.sleep(0.5)


def _live(runner: Rounds) -> list[Any]:
    return [i for i in runner.store.instances("hpc") if i.is_live]


# ---------------------------------------------------------------- through `sco run`


def test_jobs_bring_up_nodes_through_sco_run_and_all_complete(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot
) -> None:
    """Eight single-node jobs wait in an empty partition; `sco run` (the configuration
    file, the Slurm demand, the Nova provider) brings up nodes; all eight complete; the
    idle nodes then go."""
    jobs = [cluster.sbatch("-N1", "-c1", "-t", "2", seconds=5) for _ in range(8)]
    config = _config(tmp_path, stack, cluster)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: boot.booted or proc.poll() is not None, 120, "a first node")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        first_s = time.monotonic() - started
        seen = [0]

        def done() -> bool:
            # The most nodes at once: by the last job's end, idle ones may have gone.
            seen[0] = max(seen[0], len(cluster.nodes))
            return set(jobs) <= cluster.completed()

        wait_for(done, 180, "all eight jobs done")
        peak = seen[0]
        # Nothing left to run: after idle_keep_s the nodes drain and their servers go.
        wait_for(lambda: not stack.servers(tags="sco"), 120, "idle nodes handed back")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:]
    assert 4 <= peak <= 8  # eight 1-CPU jobs on 2-CPU nodes
    echo(f"slurm: first node in {first_s:.1f} s, eight jobs on {peak} nodes, all completed")


# ---------------------------------------------------------------- in process


def test_a_reclaim_notice_drains_requeues_and_loses_no_job(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot
) -> None:
    runner, provider = _runner(tmp_path, stack, cluster)
    jobs = [cluster.sbatch("-N1", "-c2", "-t", "5", seconds=30) for _ in range(4)]
    _rounds(
        runner, provider, lambda: all(cluster.job_nodes(j) for j in jobs), 180, "4 jobs running"
    )
    on = {j: cluster.job_nodes(j) for j in jobs}
    victims = [sid for sid, name in boot.booted.items() if name in {on[jobs[0]], on[jobs[1]]}]
    assert len(victims) == 2
    deadline = time.time() + 20
    for sid in victims:
        r = stack.conn.compute.put(
            f"/servers/{sid}/metadata/{META_RECLAIM_AT}",
            json={"meta": {META_RECLAIM_AT: f"{deadline:.0f}"}},
            microversion="2.90",
        )
        assert r.status_code == 200, r.text

    drained_at: dict[str, float] = {}

    def drained() -> bool:
        states = cluster.node_states()
        for sid in victims:
            name = boot.booted.get(sid, "")
            if sid not in drained_at and "drain" in states.get(name, ("", ""))[0]:
                drained_at[sid] = time.time()
        return len(drained_at) == 2

    _rounds(runner, provider, drained, 60, "both reclaimed nodes draining")
    assert max(drained_at.values()) < deadline, "drained before the deadline"
    _rounds(runner, provider, lambda: set(jobs) <= cluster.completed(), 240, "all jobs done")
    restarts = _restarts(cluster, jobs)
    assert restarts[jobs[0]] >= 1
    assert restarts[jobs[1]] >= 1, "the jobs on the reclaimed nodes were requeued"
    history = runner.store.history()
    noticed = {r.instance_id for r in history if r.to_state == "noticed"}
    assert len(noticed) == 2
    assert not [sid for sid in victims if sid in {s["id"] for s in stack.servers()}]
    found = audit(runner.store.url, stack.servers(tags="sco"))
    assert found["duplicate_creates"] == 0, found
    assert found["leaked_servers"] == 0, found


def _restarts(cluster: SlurmCluster, jobs: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for j in jobs:
        text = subprocess.run(
            ["scontrol", "show", "job", str(j)], env=cluster.env, capture_output=True,
            text=True, check=False,
        ).stdout  # fmt: skip
        restarts = [f for f in text.split() if f.startswith("Restarts=")]
        out[j] = int(restarts[0].split("=")[1]) if restarts else 0
    return out


def test_jobs_asking_for_guaranteed_run_only_on_guaranteed_nodes(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot
) -> None:
    runner, provider = _runner(tmp_path, stack, cluster)
    g = [cluster.sbatch("-N1", "-c1", "-t", "2", "--constraint=guaranteed", seconds=20)
         for _ in range(2)]  # fmt: skip
    anywhere = cluster.sbatch("-N1", "-c2", "-t", "2", seconds=20)
    _rounds(
        runner, provider, lambda: all(cluster.job_nodes(j) for j in [*g, anywhere]), 180,
        "the jobs running",
    )  # fmt: skip
    classes = {
        boot.booted[s["id"]]: s["metadata"]["sco:class"]
        for s in stack.servers(tags="sco")
        if s["id"] in boot.booted
    }
    for j in g:
        assert classes[cluster.job_nodes(j)] == "guaranteed", (j, classes)
    states = cluster.node_states()
    assert "guaranteed" in states[cluster.job_nodes(g[0])][1]
    elsewhere = classes[cluster.job_nodes(anywhere)]
    _rounds(runner, provider, lambda: {*g, anywhere} <= cluster.completed(), 120, "done")
    # Node-hours by class, read back from Slurm's accounting: 2 x 20 s on guaranteed,
    # 20 s where the other job ran (jobs of earlier tests ran on nodes of no class here).
    want = Counter({"guaranteed": 40.0})
    want[elsewhere] += 20.0

    def usage() -> dict[str, float] | None:
        done = subprocess.run(
            [sys.executable, "-m", "sco.apps.cli", "slurm", "usage", "hpc", "--since", "1h",
             "--json", "--config", str(tmp_path / "sco.yaml")],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        hours: dict[str, float] = json.loads(done.stdout)["node_hours"]
        seconds = {k: hours.get(k, 0.0) * 3600 for k in want}
        return hours if all(abs(seconds[k] - v) <= 6 for k, v in want.items()) else None

    hours = wait_for(usage, 30, f"sacct to show {dict(want)} node-seconds")
    echo(f"slurm: node-hours by class from sacct: {hours}")


def test_a_node_that_never_registers_is_replaced(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot
) -> None:
    boot.refuse_next = 1  # the first server's slurmd never starts
    runner, provider = _runner(tmp_path, stack, cluster, Timeouts(active_timeout_s=20))
    job = cluster.sbatch("-N1", "-c2", "-t", "2", seconds=2)
    _rounds(runner, provider, lambda: job in cluster.completed(), 180, "the job done elsewhere")
    history = runner.store.history()
    expired = [r for r in history if r.from_state == "active" and r.to_state == "failed"]
    assert expired, "the server whose node never joined timed out of ACTIVE"
    assert boot.refuse


def test_slurmctld_restart_and_outage_lose_nothing(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot
) -> None:
    runner, provider = _runner(tmp_path, stack, cluster)
    jobs = [cluster.sbatch("-N1", "-c1", "-t", "2", seconds=25) for _ in range(4)]
    _rounds(runner, provider, lambda: len(_live(runner)) >= 2 and boot.booted, 180, "nodes")

    def kept() -> set[str]:
        """Servers listed, less those whose delete sco sent (Nova may list a server
        still building for a moment after its delete was accepted)."""
        going = {i.server_id for i in runner.store.instances("hpc") if not i.is_live}
        return {s["id"] for s in stack.servers(tags="sco")} - going

    servers = kept()
    # slurmctld down: every cycle is degraded, and nothing is deleted or created.
    cluster._ctld.send_signal(15)  # type: ignore[union-attr]
    cluster._ctld.wait(timeout=30)  # type: ignore[union-attr]
    reports = [runner.round() for _ in range(3)]
    assert all(c.degraded for r in reports for c in r.cycles)
    assert kept() == servers
    cluster.restart_ctld()
    _rounds(runner, provider, lambda: set(jobs) <= cluster.completed(), 240, "all jobs done")
    found = audit(runner.store.url, stack.servers(tags="sco"))
    assert found["duplicate_creates"] == 0, found
    assert found["leaked_servers"] == 0, found
    names = [n for n in cluster.node_states() if n.startswith("sco-") and "hpc-" not in n]
    assert len(names) == len(set(names)), "no node twice"


# ---------------------------------------------------------------- bad input at start


def test_the_slurm_bench_at_smoke_size(
    tmp_path: Path,
    stack: NovaStack,
    cluster: SlurmCluster,
    boot: SlurmBoot,
    bench: Callable[[str], ModuleType],
) -> None:
    """bench/slurm.py's own code to its result, on this tier's services: every job
    completes, none is lost, and the node-hours read back from Slurm's accounting."""
    args = argparse.Namespace(
        jobs=4, notice_every=8.0, notice_s=30.0, limit_s=300.0, job_s=(8.0, 15.0),
        wave_every=5.0, seed=3,
    )  # fmt: skip
    result = bench("slurm").measure(tmp_path, stack, cluster, boot, args)
    assert result["jobs_submitted"] == 4, result
    assert result["jobs_completed"] == 4, result
    assert result["jobs_lost"] == 0, result
    assert result["first_node_ready_s"] is not None, result
    assert sum(result["node_hours"].values()) > 0, result


def test_the_slurm_replay_bench_at_smoke_size(
    tmp_path: Path,
    stack: NovaStack,
    cluster: SlurmCluster,
    boot: SlurmBoot,
    bench: Callable[[str], ModuleType],
) -> None:
    """bench/slurm_replay.py's own code to its result, on this tier's services: a few
    jobs of the bundled workload's first hours, replayed on real Slurm and in the lab,
    each job of many nodes kept in one pool (sco's job_submit.lua; the lab's cluster);
    every job completes on both sides, and where Slurm ran them is measured."""
    module = bench("slurm_replay")
    args = argparse.Namespace(
        workload=module.DATA / "workloads" / "synthetic-2d.swf", speedup=600.0, hours=3.0,
        max_nodes=4, procs_per_node=None, trace=module.DATA / "traces" / "apache" / "v100-9zone",
        notice_s=5.0, requeue_lead_s=3.0, interval_s=1.0, cold_start_s=2.5, limit_s=150.0,
        seed=0, one_pool=True,
    )  # fmt: skip
    result = module.measure(tmp_path, stack, cluster, boot, args)
    keys = ("jobs", "completed_real", "completed_sim", "requeues_real", "requeues_sim",
            "wait_p95_real_s", "wait_p95_sim_s", "multi_node_runs", "multi_node_runs_one_pool",
            "one_pool_share_real", "one_pool_share_when_room_real",
            "wide_jobs_multi_pool_sim")  # fmt: skip
    assert all(key in result for key in keys), result
    assert result["jobs"] >= 5, result
    assert result["completed_real"] == result["jobs"], result
    assert result["completed_sim"] == result["jobs"], result
    assert result["multi_node_runs"] >= 1, result  # the window has jobs of 3 and 4 nodes
    share = result["one_pool_share_real"]
    assert isinstance(share, float | int), result
    assert 0 <= share <= 1, result
    assert result["jobs_bracketed"] >= 1, result  # the job_submit.lua was in effect


def test_slurm_start_errors_exit_2_naming_the_problem(
    tmp_path: Path, stack: NovaStack, cluster: SlurmCluster
) -> None:
    def run(config: Path) -> tuple[int, str]:
        p = subprocess.run(
            [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config), "--dry-run"],
            capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
        )  # fmt: skip
        return p.returncode, p.stderr

    unknown = _config(tmp_path, stack, cluster)
    doc = yaml.safe_load(unknown.read_text())
    doc["partitions"][0]["slurm"]["partitions"] = ["nope"]
    unknown.write_text(yaml.safe_dump(doc))
    code, err = run(unknown)
    assert code == 2, err
    assert "partitions.hpc.slurm.partitions: nope not in Slurm cluster 'main'" in err

    dead = tmp_path / "dead.conf"
    text = cluster.conf.read_text().replace(f"SlurmctldPort={cluster.ctld_port}",
                                            f"SlurmctldPort={free_port()}")  # fmt: skip
    dead.write_text(text)
    doc["partitions"][0]["slurm"]["partitions"] = ["batch"]
    doc["slurm"]["main"]["conf"] = str(dead)
    doc["slurm"]["main"]["timeout_s"] = 5
    unknown.write_text(yaml.safe_dump(doc))
    code, err = run(unknown)
    assert code == 2, err
    assert "slurm.main:" in err
    assert "Unable to contact" in err or "did not answer" in err, err

    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("squeue", "sinfo", "scontrol"):
        script = fake / tool
        script.write_text('#!/bin/sh\necho \'{"nodes": [{"name": 3}], "jobs": []}\'\n')
        script.chmod(0o755)
    doc["slurm"]["main"] = {"conf": str(cluster.conf), "bin_dir": str(fake)}
    unknown.write_text(yaml.safe_dump(doc))
    code, err = run(unknown)
    assert code == 2, err
    assert "slurm.main:" in err
    assert "Traceback" not in err


def _leave_by(drain_by: float, reclaim: bool) -> Contract:
    """A contract that tells its node to leave by `drain_by`."""
    terms = Terms("hpc", "lab/a/spot", "spot", 1, NodeState.LEAVING, drain_by, reclaim)
    return Contract("i-agentnode01", 2, terms, join="", lease_expires_at=drain_by)


def test_an_agent_drains_its_own_node_requeuing_only_on_a_reclaim(cluster: SlurmCluster) -> None:
    """`sco agent --slurm-node`'s drain, against the real daemons: a reclaim requeues
    what would not end by the deadline; sco's own move only waits for the job."""
    from sco.adapters.slurm.drain import SlurmDrain
    from sco.adapters.slurm.tools import ClusterTools, SlurmTools

    name = "sco-agentnode01"
    cluster.add_node(name, ["sco", "sco-hpc", "spot"])
    tools = SlurmTools(ClusterTools("test", cluster.conf))
    try:
        wait_for(lambda: cluster.node_states().get(name, ("",))[0] == "idle", 60, "node idle")
        long_job = cluster.sbatch("-w", name, "-t", "10", seconds=300)
        wait_for(lambda: cluster.squeue().get(long_job) == "RUNNING", 60, "the job running")
        drain = SlurmDrain(tools, name, requeue_lead_s=5, clock=time.time, sleep=time.sleep,
                           poll_s=0.5)  # fmt: skip
        status, detail = drain(_leave_by(time.time() + 10, reclaim=True))
        assert status == "drained", detail
        assert f"requeued jobs {long_job} (eligible at once)" in detail
        assert "drain" in cluster.node_states()[name][0]
        # Not held back with BeginTime, which sco's demand does not count: in the lab
        # the replacement was let go as over target while the job waited for 120 s.
        why = subprocess.run(
            ["squeue", "-h", "-j", str(long_job), "-o", "%r"],
            env=cluster.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert why.stdout.strip() != "BeginTime", why.stdout
        subprocess.run(["scancel", str(long_job)], env=cluster.env, check=False)
        subprocess.run(["scontrol", "update", f"nodename={name}", "state=RESUME"],
                       env=cluster.env, check=False)  # fmt: skip
        wait_for(lambda: cluster.node_states().get(name, ("",))[0] == "idle", 60, "resumed")
        short_job = cluster.sbatch("-w", name, "-t", "10", seconds=4)
        wait_for(lambda: cluster.squeue().get(short_job) == "RUNNING", 60, "the job running")
        status, detail = drain(_leave_by(time.time() + 60, reclaim=False))
        assert status == "drained", detail
        assert "requeued" not in detail
        assert short_job in cluster.completed(), "a voluntary drain waits for the job"
    finally:
        cluster.remove_node(name)
        subprocess.run(["scontrol", "delete", f"nodename={name}"], env=cluster.env,
                       capture_output=True, check=False)  # fmt: skip
