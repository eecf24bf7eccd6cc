"""The Slurm adapter's logic on what Slurm 22.05's JSON says, without daemons: parsing,
demand from pending jobs, drains, requeues before a reclaim, node-hours by class, and
the floor keeper honouring work that asks for guaranteed capacity. What Slurm itself
answers to sco's calls (real slurmctld and the lab's clusters alike):
tests/conformance/test_schedulers.py; sco against the daemons: `test_slurm.py`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec, need
from sco.adapters.slurm.model import SlurmBadOutput, parse_allocations, parse_jobs, parse_nodes
from sco.adapters.slurm.nodes import (
    SlurmNodes,
    SlurmPartition,
    SlurmView,
    node_features,
    node_name,
)
from sco.adapters.slurm.tools import ClusterTools, SlurmTools, SlurmUnavailable
from sco.adapters.slurm.usage import node_hours
from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.binpack import Size, pack
from sco.decide.hedge import HedgeConfig, plan
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.domain.snapshot import PoolView
from sco.engine.clock import ManualClock
from sco.engine.dryrun import DryRunNodes
from sco.ports import NodeView, SchedulerUnavailable, ServerStatus, ServerView
from sco_harness.builders import guaranteed_pool, snapshot, spot_pool

SHAPE = Size(2, 1000)
PART = SlurmPartition("hpc", ("batch",), SHAPE, requeue_lead_s=30, idle_keep_s=300)


def job(
    job_id: int,
    state: str = "PENDING",
    *,
    nodes: int = 1,
    cpus: int = 1,
    mem: str = "500M",
    reason: str = "Resources",
    features: str = "",
    requeue: bool = True,
    end: int = 0,
    on: Sequence[str] = (),
    gres: str = "",
    restarts: int = 0,
    begin: int = 0,
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "restart_cnt": restarts,
        "begin_time": begin,
        "job_state": state,
        "state_reason": reason,
        "partition": "batch",
        "node_count": nodes,
        "cpus": cpus,
        "tres_req_str": f"cpu={cpus},mem={mem},node={nodes},billing={cpus}",
        "tres_per_node": gres,
        "memory_per_node": None,
        "features": features,
        "requeue": requeue,
        "time_limit": 5,
        "end_time": end,
        "job_resources": {"allocated_nodes": [{"nodename": n} for n in on]} if on else {},
    }


def node(
    name: str,
    *,
    state: str = "idle",
    flags: Sequence[str] = ("DYNAMIC_NORM",),
    features: str = "sco,sco-hpc,spot",
    alloc_cpus: int = 0,
    reason: str = "",
    last_busy: int = 0,
) -> dict[str, Any]:
    return {
        "name": name,
        "state": state,
        "state_flags": list(flags),
        "features": features,
        "active_features": features,
        "reason": reason,
        "cpus": 2,
        "alloc_cpus": alloc_cpus,
        "real_memory": 1000,
        "alloc_memory": 0,
        "partitions": ["batch"],
        "last_busy": last_busy,
        "slurmd_start_time": 50,
    }


# ---------------------------------------------------------------- packing


def test_first_fit_decreasing_uses_free_room_first() -> None:
    slices = [Size(1, 100), Size(2, 100), Size(1, 100), Size(1, 100)]
    p = pack(slices, SHAPE, free=[Size(1, 500)])
    assert p.used_free == (0,)
    assert p.new_nodes == 2  # 2 | 1+1, after one 1-CPU slice took the free room
    assert pack([Size(4, 10)], SHAPE).unfit == (Size(4, 10),)
    assert pack([Size(1, 10, {"gpu": 1})], SHAPE).unfit, "no GPU on the shape"
    gpu = Size(2, 1000, {"gpu": 2})
    assert pack([Size(1, 10, {"gpu": 1})] * 3, gpu).new_nodes == 2


# ---------------------------------------------------------------- parsing


def test_jobs_and_nodes_parse_strictly() -> None:
    jobs = parse_jobs({"jobs": [job(1, nodes=2, cpus=4, mem="2000M", gres="gres:gpu:1")]}, "t")
    assert jobs[0].per_node == Size(2, 1000, {"gpu": 1})
    assert jobs[0].wants("spot") is False
    with_g = parse_jobs({"jobs": [job(2, features="guaranteed&fast")]}, "t")[0]
    assert with_g.wants("guaranteed")
    nodes = parse_nodes(
        {"nodes": [node("sco-a", state="mixed", flags=["DRAIN"], alloc_cpus=1)]}, "t"
    )
    assert nodes[0].draining
    assert nodes[0].busy
    assert not nodes[0].drained
    with pytest.raises(SlurmBadOutput, match=r"t: jobs\[0\]: no 'node_count'"):
        parse_jobs({"jobs": [{k: v for k, v in job(1).items() if k != "node_count"}]}, "t")
    with pytest.raises(SlurmBadOutput, match="not a JSON object"):
        parse_nodes([], "t")
    with pytest.raises(SlurmBadOutput, match="reported errors"):
        parse_nodes({"nodes": [], "errors": [{"error": "boom"}]}, "t")


def test_output_that_is_not_json_is_named() -> None:
    # What slurmctld away answers, and how each call says it: tests/conformance.
    def garbled(*_a: Any, **_k: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 0, "{not json", "")

    with pytest.raises(SlurmBadOutput, match="c: squeue --json: not JSON"):
        SlurmTools(ClusterTools("c"), run=garbled).jobs(["batch"])


# ---------------------------------------------------------------- demand


def _need(jobs: list[dict[str, Any]], nodes: list[dict[str, Any]], now: float = 1000.0) -> Any:
    return need(PART, parse_jobs({"jobs": jobs}, "t"), parse_nodes({"nodes": nodes}, "t"), now)


def test_work_a_reclaim_will_requeue_keeps_its_place_in_the_target() -> None:
    """Found by the lab's tour: a node draining for a reclaim left the target, so the
    replacement sco had just created was let go as over target; then the requeued job
    waited with BeginTime (not counted either) until another node was created."""
    leaving = node("sco-a", state="mixed", flags=("DRAIN",), alloc_cpus=2,
                   reason="sco: reclaim by 1970-01-01T00:20:00Z")  # fmt: skip
    busy = node("sco-b", state="allocated", alloc_cpus=2)
    runs_past = [job(1, "RUNNING", cpus=2, end=5000, on=["sco-a"]),
                 job(2, "RUNNING", cpus=2, end=5000, on=["sco-b"])]  # fmt: skip
    assert _need(runs_past, [leaving, busy]).target == 2  # sco-b, and a home for job 1
    ends_in_time = [job(1, "RUNNING", cpus=2, end=1100, on=["sco-a"]), runs_past[1]]
    assert _need(ends_in_time, [leaving, busy]).target == 1
    moved_by_sco = node("sco-a", state="mixed", flags=("DRAIN",), alloc_cpus=2,
                        reason="sco: leaving by 1970-01-01T00:20:00Z")  # fmt: skip
    assert _need(runs_past, [moved_by_sco, busy]).target == 1  # its jobs end there
    # Requeued, then held back a moment by Slurm: still demand. A begin time a user
    # asked for is not.
    requeued = job(1, reason="BeginTime", cpus=2, restarts=1)
    assert _need([requeued, runs_past[1]], [busy]).target == 2
    assert _need([job(1, reason="BeginTime", cpus=2), runs_past[1]], [busy]).target == 1


def test_pending_jobs_become_nodes() -> None:
    # Eight single-CPU jobs: four nodes of two CPUs.
    assert _need([job(i) for i in range(8)], []).target == 4
    # A two-node job of 4 CPUs: two nodes; one already idle takes half.
    assert _need([job(1, nodes=2, cpus=4, mem="1000M")], [node("sco-x")]).target == 2
    # Waiting on something else than capacity: not counted.
    held = [job(1, reason="Dependency"), job(2, reason="JobHeldUser"), job(3, reason="BeginTime")]
    assert _need(held, []).target == 0
    # Too big for the shape: reported, not counted.
    big = _need([job(1, cpus=8)], [])
    assert (big.target, big.unfit_jobs) == (0, (1,))


def test_busy_and_recently_busy_nodes_stay_wanted() -> None:
    nodes = [
        node("sco-busy", state="allocated", alloc_cpus=2),
        node("sco-idle-fresh", last_busy=900),
        node("sco-idle-old", last_busy=100),
        node("sco-leaving", flags=["DRAIN"]),
    ]
    n = _need([], nodes, now=1000.0)
    assert n.target == 2  # busy, and idle for under idle_keep_s
    assert _need([job(1, cpus=2)], nodes, now=1000.0).target == 2  # the fresh idle one takes it
    assert _need([job(1, cpus=2)] * 2, nodes, now=1000.0).target == 3  # and the old one too


def test_jobs_asking_for_guaranteed_count_there() -> None:
    jobs = [job(1, features="guaranteed"), job(2), job(3)]
    n = _need(jobs, [node("sco-g", features="sco,sco-hpc,guaranteed")])
    assert (n.target, n.guaranteed) == (2, 1)  # the idle guaranteed node takes job 1


def test_a_guaranteed_node_running_other_work_need_not_stay_guaranteed() -> None:
    """Found by `sco replay`: every busy guaranteed node counted as work only guaranteed
    capacity may serve, so spot never took over a busy cluster's guaranteed nodes and
    sco cost 11 % more than a naive spot cluster. Only work that asked for it must."""
    g = "sco,sco-hpc,guaranteed"
    nodes = [node("sco-g", state="allocated", alloc_cpus=2, features=g),
             node("sco-h", state="allocated", alloc_cpus=2, features=g)]  # fmt: skip
    jobs = [job(1, "RUNNING", cpus=2, end=5000, on=["sco-g"]),
            job(2, "RUNNING", cpus=2, end=5000, on=["sco-h"], features="guaranteed")]  # fmt: skip
    n = _need(jobs, nodes)
    assert (n.target, n.guaranteed) == (2, 1)


def test_demand_caps_and_reports(caplog: pytest.LogCaptureFixture) -> None:
    class View:
        def read(self) -> Any:
            return parse_jobs({"jobs": [job(i) for i in range(40)] + [job(99, cpus=9)]}, "t"), []

    spec = SlurmDemandSpec(
        Partition("hpc", "r", SchedulerKind.SLURM),
        PART,
        floor_units=2,
        max_units=8,
        guaranteed_budget_units=4,
    )
    source = SlurmDemandSource(View(), [spec])  # type: ignore[arg-type]
    d = source.demand("hpc", 1000.0)
    assert d == Demand(8, 2, 8, 4, 0, unfit_work=1)  # job 99: bigger than a node
    assert "jobs [99] ask more of a node than its shape has" in caplog.text


def test_a_node_finishing_a_job_is_busy() -> None:
    """sinfo --json of real slurmctld 22.05 says a node whose job is completing (its
    epilog runs) is `idle` with flag COMPLETING and no CPU allocated: read as idle, sco
    would count its room as free and delete it if its server went, the job unfinished."""
    (done,) = parse_nodes({"nodes": [node("sco-a", flags=("COMPLETING", "DYNAMIC_NORM"))]}, "t")
    (idle,) = parse_nodes({"nodes": [node("sco-b")]}, "t")
    assert (done.busy, idle.busy) == (True, False)
    n = need(PART, [], [done], 10_000.0)  # long past idle_keep_s: kept while it finishes
    assert n.target == 1


def test_a_job_slurm_lost_is_counted_nowhere_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Slurm 22.05 keeps the allocation of an exclusive job of several nodes requeued
    when they all failed at once, and calls it BadConstraints for good: no node sco
    could create runs it (tests/test_slurm_onepool.py shows it on real slurmctld)."""
    lost = {**job(7, nodes=3, cpus=6, mem="3000M", reason="BadConstraints"), "nodes": "sco-[a-c]"}
    other = job(8, nodes=3, cpus=6, mem="3000M", reason="BadConstraints")  # no NodeList
    jobs = [lost, other, job(9)]

    class View:
        def read(self) -> Any:
            return parse_jobs({"jobs": jobs}, "t"), []

    spec = SlurmDemandSpec(Partition("hpc", "r", SchedulerKind.SLURM), PART, 0, 8, 0)
    source = SlurmDemandSource(View(), [spec])  # type: ignore[arg-type]
    d = source.demand("hpc", 1000.0)
    assert (d.target_units, d.unfit_work) == (1, 1)  # job 9 only; job 7 reported
    assert "jobs [7] are pending as BadConstraints on the nodes they ran on" in caplog.text
    caplog.clear()
    source.demand("hpc", 1001.0)
    assert "BadConstraints" not in caplog.text  # said once
    jobs.remove(lost)
    source.demand("hpc", 1002.0)  # cancelled: forgotten; the same id later is said again
    jobs.append(lost)
    source.demand("hpc", 1003.0)
    assert "jobs [7] are pending as BadConstraints" in caplog.text


# ---------------------------------------------------------------- nodes and drains


class FakeTools:
    def __init__(self, jobs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        self.doc_jobs, self.doc_nodes = jobs, nodes
        self.calls: list[tuple[str, ...]] = []
        self.fail: Exception | None = None

    def jobs(self, partitions: Sequence[str]) -> Any:
        if self.fail:
            raise self.fail
        return parse_jobs({"jobs": self.doc_jobs}, "fake")

    def nodes(self) -> Any:
        return parse_nodes({"nodes": self.doc_nodes}, "fake")

    def drain(self, name: str, reason: str) -> None:
        self.calls.append(("drain", name, reason))
        for n in self.doc_nodes:
            if n["name"] == name:
                n["state_flags"] = [*n["state_flags"], "DRAIN"]
                n["reason"] = reason

    def requeue(self, job_ids: Sequence[int]) -> None:
        self.calls.append(("requeue", *map(str, job_ids)))

    def down(self, name: str, reason: str) -> None:
        self.calls.append(("down", name, reason))
        for n in self.doc_nodes:
            if n["name"] == name:
                n["state"] = "down"

    def start_now(self, job_ids: Sequence[int]) -> None:
        self.calls.append(("start_now", *map(str, job_ids)))

    def delete_node(self, name: str) -> None:
        self.calls.append(("delete", name))


def look(plane: SlurmNodes, partition: str = "hpc") -> Mapping[str, NodeView]:
    """One cycle's worth, as the controller does it: the scheduler's work, then a read."""
    plane.tend(partition, plane._listing(partition))
    return plane.nodes(partition)


def _plane(tools: FakeTools, servers: list[str], clock: ManualClock) -> SlurmNodes:
    view = SlurmView(tools, ["batch"], ttl_s=0)  # type: ignore[arg-type]
    listing = [ServerView(s, "hpc", "r/h/f", "req", 1, ServerStatus.ACTIVE, 0.0) for s in servers]
    return SlurmNodes(view, {"hpc": PART}, lambda _p: listing, clock)


def test_a_reclaim_drains_then_requeues_what_cannot_finish_just_before_the_deadline() -> None:
    clock = ManualClock(1_000_000_000.0)
    deadline = clock.now() + 120
    tools = FakeTools(
        [
            job(1, "RUNNING", on=["sco-s1"], end=int(deadline + 600)),  # runs past it
            job(2, "RUNNING", on=["sco-s1"], end=int(deadline - 10)),  # ends before
            job(3, "RUNNING", on=["sco-s1"], end=int(deadline + 600), requeue=False),
        ],
        [node("sco-s1", state="allocated", alloc_cpus=2)],
    )
    plane = _plane(tools, ["s1"], clock)
    assert look(plane)["s1"].joined
    assert look(plane)["s1"].busy
    plane.drain("hpc", "s1", deadline, "reclaim_notice")
    assert tools.calls[0] == ("drain", "sco-s1", "sco: reclaim by 2001-09-09T01:48:40Z")
    look(plane)
    assert [c for c in tools.calls if c[0] == "requeue"] == []  # not yet: 120 s to go
    clock.set(deadline - 29)
    look(plane)
    assert [c for c in tools.calls if c[0] == "requeue"] == [("requeue", "1")]
    views = look(plane)
    assert len([c for c in tools.calls if c[0] == "requeue"]) == 1, "once"
    assert "job 3 cannot be requeued" in views["s1"].note, "reported, for the node's event"
    assert not [c for c in tools.calls if c[0] == "down"]
    clock.set(deadline)
    look(plane)
    assert ("down", "sco-s1", "sco: reclaim by 2001-09-09T01:48:40Z") in tools.calls
    look(plane)
    assert len([c for c in tools.calls if c[0] == "down"]) == 1
    # Requeued and pending again: eligible at once, not after Slurm's credential wait.
    tools.doc_jobs[0] = job(1, "PENDING")
    look(plane)
    assert ("start_now", "1") in tools.calls
    # It runs again on a node whose reclaim is due too: requeued again.
    tools.doc_nodes.append(node("sco-s2", state="allocated", alloc_cpus=2))
    tools.doc_jobs[0] = job(1, "RUNNING", on=["sco-s2"], end=int(deadline + 600))
    plane.drain("hpc", "s2", deadline, "reclaim_notice")
    look(plane)
    assert len([c for c in tools.calls if c[0] == "requeue"]) == 2


def test_a_job_requeued_before_a_reclaim_is_eligible_in_the_same_cycle() -> None:
    """Make before break: the replacement sco created on the notice is up before the
    requeue, and the job must take it at once; a cycle later, jobs queued behind it had
    taken the new nodes (seen in the bundled replay: restarts waited a cycle, and one
    in twenty waited an hour). A job Slurm still shows running is left to the next
    cycle."""
    clock = ManualClock(1_000_000_000.0)
    deadline = clock.now() + 120

    class Requeues(FakeTools):
        def requeue(self, job_ids: Sequence[int]) -> None:
            super().requeue(job_ids)
            for k, j in enumerate(self.doc_jobs):
                if j["job_id"] in job_ids and j["job_id"] != 2:  # 2 still completing
                    self.doc_jobs[k] = job(
                        j["job_id"], reason="BeginTime", restarts=1, begin=int(clock.now()) + 120
                    )

    tools = Requeues(
        [
            job(1, "RUNNING", on=["sco-s1"], end=int(deadline + 600)),
            job(2, "RUNNING", on=["sco-s1"], end=int(deadline + 600)),
        ],
        [node("sco-s1", state="allocated", alloc_cpus=2)],
    )
    plane = _plane(tools, ["s1"], clock)
    look(plane)
    plane.drain("hpc", "s1", deadline, "reclaim_notice")
    clock.set(deadline - 29)
    look(plane)
    assert [c for c in tools.calls if c[0] in ("requeue", "start_now")] == [
        ("requeue", "1", "2"),
        ("start_now", "1"),
    ]


def test_a_job_another_hand_requeued_is_made_eligible_too() -> None:
    """Found by the lab's tour under load: the node's agent requeued the job first and
    its server went before the agent made it eligible; Slurm held the job 120 s with
    BeginTime, and sco, which only restarted jobs it had requeued itself, waited."""
    clock = ManualClock(1_000_000_000.0)
    tools = FakeTools(
        [job(1, reason="BeginTime", restarts=1), job(2, reason="BeginTime")],
        [node("sco-s2")],
    )
    plane = _plane(tools, ["s2"], clock)
    look(plane)
    assert [c for c in tools.calls if c[0] == "start_now"] == [("start_now", "1")]


def test_a_deferral_someone_set_is_left_alone() -> None:
    """Issue 40, defect 6: sco set StartTime=now on every once-requeued job pending
    with BeginTime, undoing a deferral a user or an admin set (`scontrol update
    StartTime=tomorrow`), and counted it as demand now. Slurm's own hold (its
    credential's lifetime) still is made eligible and counted."""
    clock = ManualClock(1_000_000_000.0)
    now = int(clock.now())
    held = job(1, reason="BeginTime", restarts=1, begin=now + 121)
    tomorrow = job(2, reason="BeginTime", restarts=1, begin=now + 86_400)
    tools = FakeTools([held, tomorrow], [node("sco-s2")])
    plane = _plane(tools, ["s2"], clock)
    look(plane)
    assert [c for c in tools.calls if c[0] == "start_now"] == [("start_now", "1")]
    assert _need([tomorrow], [], now).target == 0
    assert _need([held], [], now).target == 1


def test_a_requeued_job_that_restarts_before_a_cycle_sees_it_is_requeued_again() -> None:
    """Found by the swarm (issue 25): a job requeued off one reclaimed node and started
    on another before any cycle saw it pending stayed in the plane's 'requeued' set,
    so the second node's reclaim never requeued it and its work was lost."""
    clock = ManualClock(1_000_000_000.0)
    deadline = clock.now() + 30
    tools = FakeTools(
        [job(1, "RUNNING", on=["sco-s1"], end=int(deadline + 9999))],
        [node("sco-s1", state="allocated", alloc_cpus=2), node("sco-s2")],
    )
    plane = _plane(tools, ["s1", "s2"], clock)
    plane.drain("hpc", "s1", deadline, "reclaim_notice")
    look(plane)
    assert ("requeue", "1") in tools.calls
    tools.doc_jobs[0] = job(1, "RUNNING", on=["sco-s2"], end=int(deadline + 9999))
    plane.drain("hpc", "s2", deadline + 60, "reclaim_notice")
    clock.set(deadline + 31)
    look(plane)
    assert [c for c in tools.calls if c[0] == "requeue"] == [("requeue", "1")] * 2


def test_sco_s_own_moves_only_drain() -> None:
    clock = ManualClock(1_000_000_000.0)
    tools = FakeTools(
        [job(1, "RUNNING", on=["sco-s1"], end=int(clock.now() + 9999))],
        [node("sco-s1", state="allocated", alloc_cpus=1)],
    )
    plane = _plane(tools, ["s1"], clock)
    plane.drain("hpc", "s1", clock.now() + 60, "over_target")
    clock.set(clock.now() + 3600)
    look(plane)
    assert ("drain", "sco-s1", "sco: over_target by 2001-09-09T01:47:40Z") in tools.calls
    assert not [c for c in tools.calls if c[0] == "requeue"]


def test_a_node_sco_drained_for_its_own_reasons_keeps_its_jobs_until_they_end() -> None:
    """Regression (issue 27's replay): an over-target drain deleted a busy node at its
    60 s deadline and threw its job's work away; a drained busy node is now pinned."""
    clock = ManualClock(1_000_000_000.0)
    tools = FakeTools(
        [job(1, "RUNNING", on=["sco-s1"], end=int(clock.now() + 9999))],
        [node("sco-s1", state="allocated", alloc_cpus=1), node("sco-s2", state="idle")],
    )
    plane = _plane(tools, ["s1", "s2"], clock)
    assert not look(plane)["s1"].pinned, "a busy node sco has not drained may be chosen"
    plane.drain("hpc", "s1", clock.now() + 60, "over_target")
    plane.drain("hpc", "s2", clock.now() + 60, "over_target")
    clock.set(clock.now() + 3600)
    seen = look(plane)
    assert seen["s1"].pinned
    assert not seen["s1"].drained
    assert not seen["s2"].pinned
    assert seen["s2"].drained


def test_nodes_of_servers_that_are_gone_are_deleted_and_others_left_alone() -> None:
    clock = ManualClock(0.0)
    tools = FakeTools(
        [],
        [
            node("sco-gone", state="down", flags=["NOT_RESPONDING"]),
            node("sco-s1"),
            node("someone-else", features="other"),
        ],
    )
    views = look(_plane(tools, ["s1"], clock))
    assert ("delete", "sco-gone") in tools.calls
    assert ("delete", "someone-else") not in tools.calls
    assert views["s1"].joined


def test_a_busy_node_whose_server_is_gone_goes_down_at_once_then_is_deleted() -> None:
    """Found by the real-Slurm replay bench: a server reclaimed without a notice left
    its job RUNNING on a dead node until slurmd's timeout; taken DOWN, Slurm requeues it."""
    clock = ManualClock(0.0)
    tools = FakeTools(
        [job(1, "RUNNING", on=["sco-gone"])],
        [node("sco-gone", state="allocated", alloc_cpus=2), node("sco-s1")],
    )
    plane = _plane(tools, ["s1"], clock)
    look(plane)
    assert ("down", "sco-gone", "sco: server gone") in tools.calls
    assert ("delete", "sco-gone") not in tools.calls  # Slurm refuses a busy node
    look(plane)
    assert [c for c in tools.calls if c[0] == "down"] == [("down", "sco-gone", "sco: server gone")]
    tools.doc_nodes[0]["alloc_cpus"] = 0  # its job requeued: down and idle
    look(plane)
    assert ("delete", "sco-gone") in tools.calls
    assert not [c for c in tools.calls if c[1] == "sco-s1"]


def test_reading_nodes_changes_nothing_and_a_dry_run_only_reads() -> None:
    """Defect 2 of issue 25: `sco run --dry-run` read the node plane through `nodes()`,
    which requeued jobs, took nodes down and deleted forgotten ones on a real cluster."""
    clock = ManualClock(1_000_000_000.0)
    deadline = clock.now() + 10
    tools = FakeTools(
        [job(1, "RUNNING", on=["sco-s1"], end=int(deadline + 600))],
        [
            node("sco-s1", state="allocated", alloc_cpus=2, flags=["DRAIN"]),
            node("sco-gone", state="down", flags=["NOT_RESPONDING"]),
        ],
    )
    tools.doc_nodes[0]["reason"] = "sco: reclaim by 2001-09-09T01:46:50Z"
    clock.set(deadline + 1)  # past the deadline: requeue and DOWN are due
    plane = _plane(tools, ["s1"], clock)
    dry = DryRunNodes(plane, [])
    for _ in range(2):
        dry.tend("hpc", plane._listing("hpc"))
        views = dry.nodes("hpc")
    assert tools.calls == []
    assert views["s1"].leaving
    assert views["s1"].reclaim_by == deadline
    look(plane)  # the leader's cycle does the work
    assert {c[0] for c in tools.calls} == {"requeue", "down", "delete"}


def test_an_unreadable_slurm_degrades_the_partition() -> None:
    tools = FakeTools([], [])
    tools.fail = SlurmUnavailable("c: squeue: Unable to contact slurm controller")
    with pytest.raises(SchedulerUnavailable, match="Unable to contact"):
        look(_plane(tools, [], ManualClock(0.0)))


def test_node_names_and_features_are_what_slurm_accepts() -> None:
    assert node_name("4E8F9A07-1c2d-4e5f-8a9b-0c1d2e3f4a5b") == "sco-4e8f9a071c2d"
    assert node_features("hpc", "spot", "lab/hall-a/spot.small") == [
        "sco",
        "sco-hpc",
        "spot",
        "pool-hall-a-spot-small",
    ]
    assert json.dumps(node_features("a b", "guaranteed", "r/h/f/agg"))


# ---------------------------------------------------------------- the policy honours it


def test_work_that_asks_for_guaranteed_capacity_gets_it() -> None:
    a, g = spot_pool("hall-1", "a"), guaranteed_pool("hall-1")
    want = Demand(4, 0, 8, 8, guaranteed_units=1)
    snap = snapshot([PoolView(a, 9), PoolView(g, 9)], want=want)
    assert arbitrate(snap, ArbiterConfig()).targets == {g.id: 1}
    p = plan(snap, HedgeConfig(max_spare=0))
    assert p.spot == {a.id: 3}
    assert p.guaranteed == {g.id: 1}


# ---------------------------------------------------------------- accounting


def test_node_hours_by_class_come_from_every_run_within_the_window() -> None:
    t = 1_800_000_000  # sacct's 0 means "never started" or "still running"
    doc = {
        "jobs": [
            {"job_id": 1, "nodes": "sco-a[1-2]", "time": {"start": t, "end": t + 3600}},
            {"job_id": 2, "nodes": "sco-g1", "time": {"start": t + 1800, "end": 0}},  # runs
            {"job_id": 2, "nodes": "sco-a1", "time": {"start": t + 600, "end": t + 1200}},
            {"job_id": 3, "nodes": "None assigned", "time": {"start": 0, "end": 0}},
            {"job_id": 4, "nodes": "static7", "time": {"start": t, "end": t + 7200}},
        ]
    }
    runs = parse_allocations(doc, "sacct")
    assert [r.job_id for r in runs] == [1, 2, 2, 4]
    expand = {"sco-a[1-2]": ["sco-a1", "sco-a2"]}
    classes = {"sco-a1": "spot", "sco-a2": "spot", "sco-g1": "guaranteed"}
    usage = node_hours(runs, classes, t + 900.0, t + 3600.0, lambda h: expand.get(h, [h]))
    assert usage.node_hours == pytest.approx(
        {"spot": 2 * 2700 / 3600 + 300 / 3600, "guaranteed": 0.5, "other": 2700 / 3600}
    )
    assert usage.runs == {"spot": 2, "guaranteed": 1, "other": 1}
    with pytest.raises(SlurmBadOutput, match=r"jobs\[0\].time"):
        parse_allocations({"jobs": [{"job_id": 1, "nodes": "x", "time": {"start": "0"}}]}, "s")


def test_hostlists_without_ranges_need_no_tool() -> None:
    def never(*_a: Any, **_k: Any) -> subprocess.CompletedProcess[str]:
        raise AssertionError("no tool call for a plain list")

    tools = SlurmTools(ClusterTools("c"), run=never)
    assert tools.hostnames("sco-ab,sco-cd") == ["sco-ab", "sco-cd"]


def test_jobs_in_other_states_are_not_read() -> None:
    # Found against slurmctld: squeue --nodelist listed a job just cancelled, with its
    # CPUs unset (null); reading it strictly failed the whole drain.
    cancelled = job(9, "PENDING")
    cancelled["job_state"] = "CANCELLED"
    cancelled["cpus"] = None
    jobs = parse_jobs({"jobs": [cancelled, job(1, "PENDING")]}, "squeue")
    assert [j.job_id for j in jobs] == [1]


# ---------------------------------------------------------------- output not of its shape
# Regressions from bench/fuzz.py (issue 17): optional fields of another type raised
# TypeError, ValueError or AttributeError from the parsers (caught only as an unnamed
# SchedulerUnavailable), and a job asking for 2**63 nodes raised OverflowError in the
# packing. Now each is a SlurmBadOutput naming the tool and the field, and a job asking
# for more nodes than the partition's most is unfit.


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("end_time", {"set": True}, "'end_time' is dict"),
        ("job_resources", [], "'job_resources' is list"),
        ("tres_req_str", ["cpu=1"], "'tres_req_str' is list"),
        ("features", 3, "'features' is int"),
        ("cpus", 10**400, "'cpus' is out of range"),
        ("end_time", 10**400, "'end_time' is out of range"),
        ("tres_req_str", "mem=" + "9" * 400 + "M", "no finite size"),
    ],
)
def test_a_job_field_of_another_kind_is_named(field: str, value: Any, said: str) -> None:
    bad = job(1, "RUNNING") | {field: value}
    with pytest.raises(SlurmBadOutput, match=rf"squeue: jobs\[0\]: .*{said}"):
        parse_jobs({"jobs": [bad]}, "squeue")


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("state_flags", True, "'state_flags' is bool"),
        ("state_flags", [1], "'state_flags' is not a list of strings"),
        ("alloc_cpus", "1", "'alloc_cpus' is str"),
        ("last_busy", 1.5, "'last_busy' is float"),
        ("slurmd_start_time", "x", "'slurmd_start_time' is str"),
        ("partitions", "batch", "'partitions' is str"),
    ],
)
def test_a_node_field_of_another_kind_is_named(field: str, value: Any, said: str) -> None:
    with pytest.raises(SlurmBadOutput, match=rf"sinfo: nodes\[0\]: {said}"):
        parse_nodes({"nodes": [node("sco-a") | {field: value}]}, "sinfo")


def test_errors_of_any_shape_are_reported() -> None:
    with pytest.raises(SlurmBadOutput, match=re.escape("reported errors: {'error': 'x'}")):
        parse_nodes({"nodes": [], "errors": {"error": "x"}}, "sinfo")


def test_gres_counts_are_ascii_digits() -> None:
    got = parse_jobs({"jobs": [job(1, gres="gres:gpu:²")]}, "t")[0]
    assert got.per_node.gres == {"gpu": 1}


def test_a_job_wanting_more_nodes_than_the_partition_has_is_unfit() -> None:
    many = parse_jobs({"jobs": [job(1, nodes=2**63), job(2)]}, "t")
    got = need(PART, many, [], 1000.0, max_nodes=8)
    assert got.unfit_jobs == (1,)
    assert got.target == 1
