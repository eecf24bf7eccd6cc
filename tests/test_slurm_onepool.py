"""Each job of many nodes in one pool (`sco slurm job-submit`): the job_submit.lua's
text, the commands that print it and the slurm.conf line that loads it, and what a
real slurmctld (job_submit/lua, dynamic nodes) does with it: a job that one pool
can hold runs there, and one that no single pool can hold waits instead of spanning
pools."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sco.adapters.slurm.demand import need
from sco.adapters.slurm.nodes import SlurmPartition, pool_feature
from sco.adapters.slurm.onepool import job_submit_lua
from sco.adapters.slurm.tools import ClusterTools, SlurmTools
from sco.decide.binpack import Size
from sco_harness.builders import write_yaml
from sco_harness.controlplane import wait_for
from sco_harness.slurm_cluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[1]
# The region file's order is sco's preference: A is tried first, and holds two nodes.
POOLS = [("spot", "lab/hallA/v100"), ("spot", "lab/hallB/v100"), ("guaranteed", "lab/hallG/v100")]
A, B, G = (pool_feature(p) for _, p in POOLS)
BRACKET = f"[{A}|{B}|{G}]"


def sco(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip


def _config(tmp: Path, region: bool = True) -> Path:
    """Partition hpc (flavor v100, Slurm partition batch) and a cpu pool it does not use."""
    halls = [(c, p.split("/")[1]) for c, p in POOLS]
    write_yaml(tmp / "region.yaml", {
        "region": "lab", "image": "i",
        "pools": [{"hall": h, "flavor": "v100", "class": c, "price_per_h": 1} for c, h in halls]
        + [{"hall": "hallA", "flavor": "cpu", "class": "spot", "price_per_h": 1}],
    })  # fmt: skip
    provider: dict[str, object] = {"cloud": "nowhere"}
    if region:
        provider["region_file"] = str(tmp / "region.yaml")
    return write_yaml(tmp / "sco.yaml", {
        "provider": provider,
        "slurm": {"main": {"conf": str(tmp / "slurm.conf")}},
        "partitions": [{
            "name": "hpc", "kind": "slurm", "demand": "slurm", "flavors": ["v100"],
            "max_units": 8,
            "slurm": {"cluster": "main", "partitions": ["batch"], "cpus": 2, "memory_mb": 1000,
                      "one_pool": True, "one_pool_max_nodes": 3},
        }],
    })  # fmt: skip


# ---------------------------------------------------------------- the text


def test_the_script_maps_each_partition_to_its_pools_in_order() -> None:
    text = job_submit_lua({"batch": ["pool-b", "pool-a", "pool-b"], "gpu": ["pool-g"]}, "gpu")
    assert '  ["batch"] = {"pool-b", "pool-a"},' in text  # sco's order, each once
    assert '  ["gpu"] = {"pool-g"},' in text
    assert 'local DEFAULT = "gpu"' in text
    assert "local WIDEST = {}" in text  # no job too wide to keep in one pool
    wide = job_submit_lua({"batch": ["pool-a"], "gpu": ["pool-g"]}, widest={"gpu": 4})
    assert 'local WIDEST = {["gpu"] = 4}' in wide
    assert "local DEFAULT = nil" in job_submit_lua({"batch": ["pool-a"]})
    # Never refuses a job, and lets every change of a job through.
    assert "function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)\n" \
        "  return slurm.SUCCESS\nend" in text  # fmt: skip
    assert text.rstrip().endswith("return slurm.SUCCESS")
    assert "pcall(one_pool, job_desc, submit_uid)" in text
    assert text.count("slurm.log_info(") == 1
    assert text.count("slurm.ERROR") == 0


@pytest.mark.parametrize(
    ("pools", "default", "error"),
    [
        ({}, None, "no Slurm partition"),
        ({"batch": []}, None, "batch: no pool"),
        ({"batch": ['pool-a"]']}, None, "pool feature 'pool-a\"]'"),
        ({"batch": ["pool-a|pool-b"]}, None, "not of [A-Za-z0-9_-]"),
        ({'b"atch': ["pool-a"]}, None, "Slurm partition name"),
        ({"batch": ["pool-a"]}, "debug", "default partition 'debug': not one of batch"),
    ],
)
def test_the_script_refuses_what_it_could_not_quote(
    pools: dict[str, list[str]], default: str | None, error: str
) -> None:
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("|", r"\|")):
        job_submit_lua(pools, default)


# ---------------------------------------------------------------- the commands


def test_slurm_conf_loads_the_plugin_when_the_pools_are_known(tmp_path: Path) -> None:
    out = sco("slurm", "conf", "hpc", "--config", _config(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "JobSubmitPlugins=lua" in lines
    assert any("`sco slurm job-submit hpc`" in x for x in lines if x.startswith("#"))
    spot = next(x for x in lines if x.startswith("NodeName=sco-hpc-spot "))
    assert f",{A},{B} " in spot  # the bracket's features are valid before any node
    without = sco("slurm", "conf", "hpc", "--config", _config(tmp_path / "n", region=False))
    assert without.returncode == 0, without.stderr
    assert "JobSubmitPlugins" not in without.stdout


def test_slurm_job_submit_prints_the_partition_s_pools(tmp_path: Path) -> None:
    config = _config(tmp_path)
    out = sco("slurm", "job-submit", "hpc", "--config", config)
    assert out.returncode == 0, out.stderr
    assert out.stdout == job_submit_lua(
        {"batch": [A, B, G]}, widest={"batch": 3}
    )  # not the cpu pool
    default = sco("slurm", "job-submit", "hpc", "--default-partition", "batch", "--config", config)
    assert default.returncode == 0, default.stderr
    assert 'local DEFAULT = "batch"' in default.stdout


@pytest.mark.parametrize(
    ("args", "region", "error"),
    [
        (["hpc"], False, "provider.region_file: not set"),
        (["nope"], True, "no partition 'nope' with demand slurm (those: hpc)"),
        (["hpc", "--default-partition", "debug"], True,
         "--default-partition debug: not a Slurm partition of hpc (those: batch)"),
    ],
)  # fmt: skip
def test_slurm_job_submit_exits_2_naming_the_problem(
    tmp_path: Path, args: list[str], region: bool, error: str
) -> None:
    out = sco("slurm", "job-submit", *args, "--config", _config(tmp_path, region))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert error in line
    assert out.stdout == ""


# ---------------------------------------------------------------- real slurmctld


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld with sco's job_submit.lua as `sco slurm conf|job-submit` print them."""
    tmp = tmp_path_factory.mktemp("onepool")
    config = _config(tmp)
    conf = sco("slurm", "conf", "hpc", "--config", config)
    lua = sco("slurm", "job-submit", "hpc", "--config", config)
    assert conf.returncode == 0, conf.stderr
    assert lua.returncode == 0, lua.stderr
    assert "JobSubmitPlugins=lua" in conf.stdout.splitlines()
    c = SlurmCluster(
        tmp / "slurm", partitions=("batch",), sco_partition="hpc", pools=POOLS,
        extra_conf=["JobSubmitPlugins=lua"], files={"job_submit.lua": lua.stdout},
    )  # fmt: skip
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _slurm(cluster: SlurmCluster, *args: str) -> str:
    done = subprocess.run(list(args), env=cluster.env, capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
    return done.stdout.strip()


def _features(cluster: SlurmCluster, job: int) -> str:
    """The job's features as slurmctld keeps them ("" for none)."""
    out = _slurm(cluster, "squeue", "-h", "-j", str(job), "-o", "%f")
    return "" if out == "(null)" else out


def _nodes(cluster: SlurmCluster, job: int) -> set[str]:
    listed = cluster.job_nodes(job)
    return (
        set(_slurm(cluster, "scontrol", "show", "hostnames", listed).split()) if listed else set()
    )


def _clear_nodes(cluster: SlurmCluster) -> None:
    """No job and no node; a node goes once nothing runs or completes on it (sco's own
    reading of busy). slurmctld 22.05 died in this module when nodes were deleted and
    made again right after a test's scancel; the cause is not known."""
    _slurm(cluster, "scancel", "--partition", "batch")
    wait_for(lambda: not cluster.squeue(), 30, "no job left")
    tools = SlurmTools(ClusterTools("main", cluster.conf, timeout_s=60.0))

    def settled() -> bool:
        return not any(n.busy for n in tools.nodes() if n.name in cluster.nodes)

    wait_for(settled, 60, "no job running or completing on a node")
    for name in list(cluster.nodes):
        cluster.remove_node(name)
        _slurm(cluster, "scontrol", "delete", f"nodename={name}")


def test_a_job_whose_nodes_all_fail_at_once_is_lost_by_slurm_and_sco_says_so(
    cluster: SlurmCluster,
) -> None:
    """A whole pool reclaimed without notice: an exclusive job of three loses its three
    nodes at once, sco takes them DOWN (its server is gone) and deletes them. Slurm
    22.05 requeues the job but keeps its allocation, and once nodes come again it calls
    the job BadConstraints, priority 0, for good: three fresh nodes of its pool idle
    beside it. sco's demand, read from this Slurm, counts no node for it (they would
    only idle) and names it. Without --exclusive the same job runs again: checked by
    hand, not here (a Slurm bug, fixed in 23.11.11; when it goes, this test says so)."""
    _clear_nodes(cluster)
    first = ["pl1", "pl2", "pl3"]
    for name in first:
        cluster.add_node(name, ["sco", "sco-hpc", "spot", B])
    wait_for(lambda: cluster.node_states().get("pl3", ("",))[0] == "idle", 30, "B's three nodes")
    job = cluster.sbatch("-N3", "--exclusive", "-t", "5", seconds=5)
    try:
        wait_for(lambda: cluster.squeue().get(job) == "RUNNING", 30, "the job of three running")
        for name in first:  # the servers are gone: their slurmd with them
            cluster.remove_node(name)
        _slurm(cluster, "scontrol", "update", "nodename=pl[1-3]", "state=down", "reason=gone")
        for name in first:
            _slurm(cluster, "scontrol", "delete", f"nodename={name}")
        for name in ["pl4", "pl5", "pl6"]:
            cluster.add_node(name, ["sco", "sco-hpc", "spot", B])

        def reason() -> str:
            return _slurm(cluster, "squeue", "-h", "-j", str(job), "-o", "%r")

        wait_for(lambda: reason() == "BadConstraints", 60, "Slurm to call the job unrunnable")
        tools = SlurmTools(ClusterTools("main", cluster.conf, timeout_s=60.0))
        spec = SlurmPartition("hpc", ("batch",), Size(2, 1000), 30, idle_keep_s=0)
        got = need(spec, tools.jobs(["batch"]), tools.nodes(), time.time(), one_pool=True,
                   one_pool_max_nodes=3)  # fmt: skip
        assert got.lost_jobs == (job,)
        assert got.target == 0  # nothing counted for it (B's three fresh nodes idle)
        assert job not in cluster.completed()
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cluster.describe([job])}") from None
    finally:
        _clear_nodes(cluster)


def test_slurm_keeps_a_job_of_many_nodes_in_one_pool(cluster: SlurmCluster) -> None:
    """Two idle nodes in pool A (first in sco's order), three in B: `sbatch -N3` with
    no constraint runs on B's three; with one of B's busy, four idle nodes could hold
    a job of three only across pools, so it waits, and starts on B once B has room."""
    in_a, in_b = ["pa1", "pa2"], ["pb1", "pb2", "pb3"]
    for name in in_a:
        cluster.add_node(name, ["sco", "sco-hpc", "spot", A])
    for name in in_b:
        cluster.add_node(name, ["sco", "sco-hpc", "spot", B])

    def idle() -> bool:
        return all(cluster.node_states().get(n, ("",))[0] == "idle" for n in in_a + in_b)

    wait_for(idle, 30, "five idle nodes")

    job = cluster.sbatch("-N3", "--exclusive", "-t", "2", seconds=60)
    wait_for(lambda: cluster.squeue().get(job) == "RUNNING", 20, "the job of three running")
    assert _nodes(cluster, job) == set(in_b), cluster.describe([job])
    assert _features(cluster, job) == BRACKET
    _slurm(cluster, "scancel", str(job))
    wait_for(idle, 20, "the nodes idle again")

    holder = cluster.sbatch("-N1", "--exclusive", f"--constraint={B}", "-t", "2", seconds=60)
    wait_for(lambda: cluster.squeue().get(holder) == "RUNNING", 20, "one node of B busy")
    assert _features(cluster, holder) == B  # a job that chose its pool is left alone
    waiting = cluster.sbatch("-N3", "--exclusive", "-t", "2", seconds=60)
    time.sleep(6)  # three scheduling passes (sched_interval=2, bf_interval=2)
    assert cluster.squeue().get(waiting) == "PENDING", cluster.describe([waiting])
    assert _slurm(cluster, "squeue", "-h", "-j", str(waiting), "-o", "%r") == "Resources"
    _slurm(cluster, "scancel", str(holder))
    wait_for(lambda: cluster.squeue().get(waiting) == "RUNNING", 20, "the job of three on B")
    assert _nodes(cluster, waiting) == set(in_b), cluster.describe([waiting])
    _slurm(cluster, "scancel", str(waiting))


@pytest.mark.parametrize(
    ("args", "features"),
    [
        (["-N1"], ""),  # one node: nothing to split
        ([], ""),  # no node count, one task
        (["-N1", "-n2"], ""),
        (["-n3"], BRACKET),  # no node count, more tasks than a node's two CPUs
        (["-N1-3"], BRACKET),  # min_nodes 1, max_nodes 3
        (["-N4"], ""),  # wider than one_pool_max_nodes (3): it may span pools
        (["-N2", "--constraint=spot"], f"(spot)&{BRACKET}"),
        # Only a FUTURE placeholder carries G's feature: still a valid bracket.
        (["-N2", "--constraint=guaranteed"], f"(guaranteed)&{BRACKET}"),
        (["-N2", f"--constraint={A}"], A),  # the user chose a pool
        (["-N2", f"--constraint=[{B}|{A}]"], f"[{B}|{A}]"),  # a matching OR of their own
    ],
)
def test_what_the_script_adds_to_each_job(
    cluster: SlurmCluster, args: list[str], features: str
) -> None:
    """Held jobs (never started): what slurmctld stored after the script ran."""
    job = cluster.sbatch("-H", *args)
    try:
        assert _features(cluster, job) == features
    finally:
        _slurm(cluster, "scancel", str(job))
