"""Batch workloads for replay: reading SWF by its documented rules, and the lab's
Slurm cluster (first come first served, EASY backfill, requeues and lost work)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sco.decide.binpack import Size
from sco.engine.clock import ManualClock
from sco.lab.workload.cluster import REQUEUE_HOLD_S, BatchCluster
from sco.lab.workload.swf import BatchJob, WorkloadError, read_swf

FEATURE = "sco-batch"
SHAPE = Size(4, 4096)


def swf_line(
    job: int, submit: int, run: int, procs: int, limit: int, status: int = 1, given: int = -1
) -> str:
    fields = [job, submit, 0, run, given, -1, -1, procs, limit, -1, status]
    return " ".join(str(v) for v in [*fields, 1, 1, 1, 1, 1, -1, -1])


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "w.swf"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_swf_rules_keep_amend_or_leave_out_each_job_and_count_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "; MaxNodes: 64",
        "; MaxProcs: 256",
        swf_line(1, 1000, 600, 8, 900),  # kept: 2 nodes
        swf_line(2, 1100, 0, 4, 900, status=5),  # cancelled
        swf_line(3, 1200, 0, 4, 900),  # no run time
        swf_line(4, 1300, 60, -1, 900),  # no size
        swf_line(5, 1400, 60, -1, -1, given=5),  # size given, no limit: 2 nodes
        swf_line(6, 1500, 700, 4, 600),  # ran past its request
        swf_line(7, 1600, 60, 4096, 600),  # wider than the cluster
        "1 2 3 not numbers",
        swf_line(8, 1000 + 3 * 86400, 60, 4, 600),  # beyond a 2-day window
    )
    w = read_swf(path, max_nodes=100, days=2)
    assert w.procs_per_node == 4
    assert [(j.job_id, j.submit_s, j.nodes, j.run_s, j.limit_s) for j in w.jobs] == [
        (1, 0.0, 2, 600.0, 900.0),
        (5, 400.0, 2, 60.0, 60.0),
        (6, 500.0, 1, 700.0, 700.0),
    ]
    assert w.summary() == {
        "jobs_read": 9,
        "jobs_kept": 3,
        "cancelled": 1,
        "no_run_time": 1,
        "no_size": 1,
        "no_requested_time": 1,
        "ran_past_request": 1,
        "wider_than_cluster": 1,
        "malformed": 1,
        "beyond_window": 1,
    }


def test_swf_without_a_job_to_replay_says_why(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"no job to replay .*cancelled 1"):
        read_swf(write(tmp_path, swf_line(1, 0, 0, 4, 60, status=5)), max_nodes=10)
    with pytest.raises(WorkloadError, match="No such file"):
        read_swf(tmp_path / "missing.swf", max_nodes=10)


def cluster(clock: ManualClock, nodes: int, checkpoint_s: float | None = None) -> BatchCluster:
    c = BatchCluster("lab", SHAPE, clock.now, FEATURE, checkpoint_s=checkpoint_s)
    for k in range(nodes):
        c.register(f"n{k}", frozenset({"sco", FEATURE}))
    return c


def job(i: int, nodes: int, run_s: float, limit_s: float | None = None) -> BatchJob:
    return BatchJob(i, 0.0, nodes, run_s, limit_s or run_s)


def running(c: BatchCluster) -> set[int]:
    return {q.job.job_id for q in c.jobs_by_id.values() if q.state == "RUNNING"}


def test_easy_backfill_runs_what_ends_before_the_first_jobs_reservation() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 4)
    c.submit(job(1, 3, 1000))  # runs; one node free
    c.submit(job(2, 4, 100))  # the first that cannot start: reserved at t=1000
    c.submit(job(3, 1, 500))  # ends by 500 <= 1000: backfilled
    c.submit(job(4, 1, 5000))  # would delay job 2: waits
    c.step()
    assert running(c) == {1, 3}
    clock.set(500.0)
    c.step()
    assert running(c) == {1}, "job 4 must not take the node job 2 is promised"
    clock.set(1000.0)
    c.step()
    assert running(c) == {2}
    clock.set(1100.0)
    c.step()
    assert running(c) == {4}
    assert c.jobs_by_id[2].waited_s == 1000.0


def test_a_job_requeued_in_time_resumes_and_one_cut_short_loses_its_run() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 2, checkpoint_s=None)
    c.submit(job(1, 1, 1000))
    c.submit(job(2, 1, 1000))
    c.step()
    on = {q.job.job_id: q.nodes[0] for q in c.jobs_by_id.values()}
    clock.set(400.0)
    c.drain(on[1], "sco: reclaim by 2026-01-01T00:00:00Z")
    c.requeue([1])  # sco, before the deadline
    c.server_gone(on[2])  # no notice
    q1, q2 = c.jobs_by_id[1], c.jobs_by_id[2]
    assert (q1.state, q1.done_s, q1.lost_node_s, q1.requeues) == ("PENDING", 400.0, 0.0, 1)
    assert (q2.state, q2.done_s, q2.lost_node_s, q2.requeues) == ("PENDING", 0.0, 400.0, 1)
    assert q1.eligible_at == 400.0 + REQUEUE_HOLD_S
    c.start_now([1])
    c.register("n9", frozenset({"sco", FEATURE}))
    c.step()
    assert running(c) == {1}, "only the undrained new node is free"
    assert c.restart_waits == [0.0], "a replacement up before the requeue: no wait"
    clock.set(400.0 + 600.0)
    c.step()
    assert c.jobs_by_id[1].state == "COMPLETED"
    assert c.jobs_by_id[1].ended_at == 1000.0
    assert running(c) == {2}
    assert c.restart_waits == [0.0, 600.0], "the other waited for the node it freed"


def test_utilisation_is_runs_over_nodes_up_until_their_servers_went() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 2, checkpoint_s=None)  # n0, n1 up from 0
    c.submit(job(1, 1, 1000))
    c.step()
    clock.set(400.0)
    assert c.jobs_by_id[1].nodes == ("n0",)
    c.server_gone("n0")
    clock.set(500.0)
    c.delete_node("n0")  # its 400 s up count after it is gone from the list
    c.step()  # requeued: held, then on n1
    clock.set(1000.0)
    # up: n0 400 s + n1 1000 s; busy: the cut run 400 s (lost, but it ran)
    assert c.utilisation(1000.0) == pytest.approx(400.0 / 1400.0)
    c.start_now([1])
    c.step()
    clock.set(1200.0)
    assert c.utilisation(1200.0) == pytest.approx((400.0 + 200.0) / 1600.0)


def test_checkpoints_keep_work_a_lost_node_would_take() -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 2, checkpoint_s=300.0)
    c.submit(job(1, 2, 1000))
    c.step()
    clock.set(700.0)
    c.server_gone("n0")
    q = c.jobs_by_id[1]
    assert (q.done_s, q.lost_node_s) == (600.0, 2 * 100.0)
    assert c.nodes_by_name["n1"].state == "idle", "its other node is free again"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 2000), st.integers(0, 3000)),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.integers(0, 6000), max_size=4),
)
def test_no_node_runs_two_jobs_and_all_work_is_done_or_waiting(
    specs: list[tuple[int, int, int]], losses: list[int]
) -> None:
    clock = ManualClock(0.0)
    c = cluster(clock, 4)
    order = sorted(enumerate(specs), key=lambda s: s[1][2])
    pending = [
        (float(at), BatchJob(i + 1, float(at), n, float(r), float(r))) for i, (n, r, at) in order
    ]
    cuts = sorted(float(t) for t in losses)
    spare = 0
    while True:
        times = [t for t, _ in pending[:1]] + cuts[:1]
        nxt = c.next_event_time()
        if nxt is not None:
            times.append(nxt)
        if not times:
            break
        t = min(times)
        clock.set(max(t, clock.now()))
        while pending and pending[0][0] <= clock.now():
            c.submit(pending.pop(0)[1])
        while cuts and cuts[0] <= clock.now():
            cuts.pop(0)
            busy = [n for n in c.nodes_by_name.values() if n.state == "allocated"]
            if busy:
                c.server_gone(busy[0].name)
                if spare % 2:
                    c.delete_node(busy[0].name)  # as sco does once its server is gone
                spare += 1
                c.register(f"spare{spare}", frozenset({"sco", FEATURE}))
        c.step()
        # The free nodes the cluster keeps as they change are those a recount finds.
        recount = {n.name for n in c.nodes_by_name.values() if n.state == "idle" and not n.flags}
        assert set(c._free_nodes) == recount
        held: dict[str, int] = {}
        for q in c.jobs_by_id.values():
            if q.state == "RUNNING":
                assert len(q.nodes) == q.job.nodes
                for n in q.nodes:
                    assert n not in held, f"{n} runs jobs {held[n]} and {q.job.job_id}"
                    held[n] = q.job.job_id
        if clock.now() > 1e6:
            break
    for q in c.jobs_by_id.values():
        assert q.state == "COMPLETED", (q.job, q.state)
        assert q.done_s == q.job.run_s
        assert q.ended_at is not None
        assert q.ended_at >= q.job.submit_s + q.job.run_s + q.waited_s - 1e-6
