"""Creates and deletes sent without waiting (sco.engine.calls): a cycle returns before
the cloud answers, and the answer is recorded by a later cycle on the records as they
are then."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
from sco.engine.controller import PartitionController
from sco.lab.region import SimRegion
from sco.ports import CreateResult, InsufficientCapacity
from test_controller import World


class HeldCalls(Executor):
    """Calls wait until the test runs them (`run`) and then answers them (`answer`)."""

    def __init__(self) -> None:
        self.held: list[tuple[Future[Any], Callable[[], Any]]] = []
        self.ran: list[tuple[Future[Any], Any, BaseException | None]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.held.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run(self) -> None:
        """The cloud acts on every held call; their answers are not back yet."""
        for future, call in self.held:
            try:
                self.ran.append((future, call(), None))
            except BaseException as e:
                self.ran.append((future, None, e))
        self.held = []

    def answer(self) -> None:
        for future, result, error in self.ran:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        self.ran = []


def _controller(w: World, calls: Executor | int, provider: Any = None) -> PartitionController:
    return w.controller(provider, calls)


def _states(w: World) -> list[State]:
    return sorted((i.state for i in w.records()), key=str)


def test_a_cycle_returns_before_its_creates_are_answered(tmp_path: Path) -> None:
    w = World(tmp_path)
    calls = HeldCalls()
    c = _controller(w, calls)
    first = c.cycle()
    assert first.created == 0  # nothing answered yet
    assert _states(w) == [State.REQUESTED] * 3
    assert not w.region.list("p1")  # the calls have not even run
    calls.run()
    calls.answer()
    w.at(10)
    second = c.cycle()
    assert second.created == 3  # the answer is recorded by the next cycle
    assert len(w.region.list("p1")) == 3
    assert all(i.server_id for i in w.records())
    assert not calls.held  # the plan was met by the requests in flight: nothing more sent
    for t in range(20, 400, 20):
        w.at(t)
        c.cycle()
        calls.run()
        calls.answer()
    assert _states(w) == [State.READY] * 3
    assert len(w.region.list("p1")) == 3


def test_servers_listed_before_their_answer_are_recorded_once(tmp_path: Path) -> None:
    w = World(tmp_path)
    calls = HeldCalls()
    c = _controller(w, calls)
    c.cycle()
    calls.run()  # the servers exist; the answer is still on its way
    w.at(10)
    c.cycle()  # the listing finds them by request id
    found = {i.id: i.server_id for i in w.records()}
    assert all(found.values())
    assert len(set(found.values())) == 3
    calls.answer()
    w.at(20)
    c.cycle()  # the answer names the same servers: nothing is recorded twice
    assert {i.id: i.server_id for i in w.records()} == found
    assert len(w.records()) == 3
    assert not any(h.to_state == State.FAILED for h in w.store.history())


class Refusing:
    """The region, except that pool `refuses` turns creates down."""

    def __init__(self, region: SimRegion, refuses: PoolId | None = None) -> None:
        self.region = region
        self.refuses = refuses
        self.refused = 0

    def create(self, pool: PoolId, count: int, *args: Any) -> CreateResult:
        if pool == self.refuses:
            self.refused += 1
            raise InsufficientCapacity(pool, "no valid host (the cloud says)")
        return self.region.create(pool, count, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.region, name)


def test_a_refusal_answered_late_closes_its_records(tmp_path: Path) -> None:
    w = World(tmp_path)
    calls = HeldCalls()
    refusing = Refusing(w.region)
    c = _controller(w, calls, provider=refusing)
    c.cycle()
    first_pool = w.records()[0].pool
    sent = {i.id for i in w.records() if i.pool == first_pool}
    requests = {i.request_id for i in w.records() if i.pool == first_pool}
    refusing.refuses = first_pool  # the cloud turns them down when it gets to them
    calls.run()
    calls.answer()
    assert refusing.refused >= 1
    w.at(10)
    c.cycle()
    history = [h for h in w.store.history() if h.instance_id in sent]
    failed = {h.instance_id for h in history if h.to_state == State.FAILED}
    assert failed == sent
    assert all("no valid host" in h.reason for h in history if h.to_state == State.FAILED)
    assert not {r.request_id for r in w.store.reservations()} & requests  # settled


class SlowCloud:
    """The region, whose creates block until the test lets them through."""

    def __init__(self, region: SimRegion) -> None:
        self.region = region
        self.entered = threading.Event()
        self.go = threading.Event()

    def create(self, *args: Any) -> CreateResult:
        self.entered.set()
        assert self.go.wait(30)
        return self.region.create(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.region, name)


def test_a_slow_create_does_not_hold_the_cycle(tmp_path: Path) -> None:
    w = World(tmp_path)
    slow = SlowCloud(w.region)
    c = _controller(w, 2, provider=slow)  # two workers, as `sco run` has
    report = c.cycle()  # returns while the create is still with the cloud
    assert slow.entered.wait(30)
    assert not slow.go.is_set()
    assert report.created == 0
    assert _states(w) == [State.REQUESTED] * 3
    slow.go.set()
    for _ in range(600):
        if w.region.server_count() == 3:
            break
        threading.Event().wait(0.05)
    w.at(10)
    assert c.cycle().created == 3
    assert len(w.region.list("p1")) == 3


def test_a_replica_keeps_cycling_while_a_create_hangs(tmp_path: Path) -> None:
    """`sco run`'s replica sends creates on its workers: a create the cloud never
    answers holds neither its partition's cycles nor the others'."""
    from sco.adapters.sqlstate.engine import sqlite_url
    from sco.engine.cycle import CycleReport
    from test_replicas import Cluster

    cluster = Cluster(tmp_path, sqlite_url(tmp_path / "state.db"))
    slow = SlowCloud(cluster.region)
    reports: list[CycleReport] = []
    runner = cluster.start("r1", slow, interval_s=0.05, on_report=reports.append, calls=2)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    try:
        assert slow.entered.wait(30)  # a create is with the cloud, and stays there
        seen = len(reports)
        deadline = threading.Event()
        for _ in range(600):
            if len({r.partition for r in reports[seen:]}) == len(runner.partitions):
                break
            deadline.wait(0.05)
        cycled = {r.partition for r in reports[seen:]}
        assert cycled == set(runner.partitions)  # every partition cycled since
        assert not slow.go.is_set()
    finally:
        slow.go.set()
        stop.set()
        thread.join(30)
        cluster.stores["r1"].close()
    assert not thread.is_alive()


def test_a_create_that_no_longer_stands_when_a_worker_gets_to_it_is_never_sent(
    tmp_path: Path,
) -> None:
    """Issue 40, defect 3: the worker pool (shared by every partition) could send a
    create after the listing grace had closed its REQUESTED records, or after the
    partition's lease was let go: its servers were then adopted as strangers and the
    partition overshot. A create that waited past half the grace, or whose partition
    changed hands, is not sent: its records are closed as not sent."""
    for late in ("waited", "lease let go"):
        w = World(tmp_path / late.replace(" ", "-"))
        calls = HeldCalls()
        c = _controller(w, calls)
        c.records.fence.token = 5  # the lease it holds
        c.cycle()
        assert _states(w) == [State.REQUESTED] * 3
        if late == "waited":
            w.at(31)  # the listing grace is 60 s
        else:
            c.records.fence.revoke()  # what its runner does when the lease goes
        calls.run()
        assert not w.region.list("p1"), f"{late}: the cloud was never asked"
        calls.answer()
        if late == "lease let go":
            return  # the controller stops: another leader's listing closes the records
        c.cycle()
        failed = [h for h in w.store.history() if h.to_state == State.FAILED]
        assert len(failed) == 3
        assert all("not sent: it waited 31 s for a worker" in h.reason for h in failed)


def test_a_replacement_answered_after_the_next_cycle_owes_nothing_twice(tmp_path: Path) -> None:
    # Regression (the swarm on sco run's worker pool, seed 23): the cycle after a
    # replacement was sent cut what is owed to what is short (nothing: the request
    # counts), then the late answer took its replacement off again. Owed went below
    # zero, and the next create of n made n + 1 records and servers on a reservation
    # of n, over max_units.
    w = World(tmp_path)
    calls = HeldCalls()
    c = _controller(w, calls)
    for t in range(0, 200, 20):
        w.at(t)
        c.cycle()
        calls.run()
        calls.answer()
    assert _states(w) == [State.READY] * 3
    noticed = w.records()[0].server_id
    assert noticed is not None
    w.region.give_notice(noticed, 600.0)  # leaving, and still counted meanwhile
    w.at(300)
    c.cycle()  # the notice seen: a replacement owed, and requested
    assert c.acquirer.owed == 1
    assert len(calls.held) == 1
    w.at(320)
    c.cycle()  # the create still waits for a worker: its records are REQUESTED
    calls.run()
    calls.answer()
    w.at(340)
    c.cycle()  # the answer is recorded now, on records the listing had not settled
    assert c.acquirer.owed == 0


def test_a_create_waiting_for_a_worker_is_not_sent_once_the_partition_is_handed_back(
    tmp_path: Path,
) -> None:
    # Regression (the swarm on sco run's worker pool, seeds 68, 79, 159): a create
    # decided before `sco handback` went out after it, though the leader "creates
    # nothing more" once the intent is recorded.
    w = World(tmp_path)
    calls = HeldCalls()
    c = _controller(w, calls)
    c.cycle()
    w.store.put_intent("p1", "handback", 5.0, "operator")
    w.at(5)
    calls.run()
    assert not w.region.list("p1"), "no create goes out after the handback"
    calls.answer()
    w.at(10)
    c.cycle()
    failed = [h for h in w.store.history() if h.to_state == State.FAILED]
    assert len(failed) == 3
    assert all("handed back while it waited" in h.reason for h in failed)


def test_an_answer_whose_recording_fails_is_recorded_by_a_later_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (the swarm, seed 89): the cycle that applied the creates' answers
    # lost fleet state while recording the first; that answer and those behind it were
    # dropped all the same. A server then reclaimed before any listing showed it had
    # no record naming it: its REQUESTED record was closed as "no server was created".
    w = World(tmp_path)
    calls = HeldCalls()
    c = _controller(w, calls)
    c.cycle()
    calls.run()
    made = sorted(sid for _, answer, _ in calls.ran for sid in answer.result.server_ids)
    assert len(made) == 3
    calls.answer()
    requests = {i.request_id for i in w.records()}
    assert len(requests) >= 2  # an answer behind the one whose recording fails

    def away(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("could not connect to the database")

    record = w.store.record
    monkeypatch.setattr(w.store, "record", away)
    w.at(10)
    with pytest.raises(ConnectionError):
        c.cycle()  # applying the answers, fleet state goes away
    monkeypatch.setattr(w.store, "record", record)
    w.region.delete(made)  # reclaimed before any listing of sco's showed them
    w.at(100)  # past the listing grace
    assert not w.region.list("p1")
    c.cycle()
    lives = {sid: state for _, sid, state in w.store.lives() if sid}
    assert sorted(lives) == made  # each server named by a record
    assert set(lives.values()) == {"gone"}
    assert not any("no server was created" in h.reason for h in w.store.history())


def test_a_call_that_failed_is_applied_once() -> None:
    # The call's own failure (a create whose worker could not read fleet state to ask
    # whether the partition was handed back) is the same every time: kept for the next
    # cycle as a failed recording is, it raised again in every cycle and the partition
    # stopped for good (the swarm, seed 58, on a first version of the fix above).
    from sco.engine.calls import InlineCalls, Outbound

    out = Outbound(InlineCalls())
    applied: list[Future[Any]] = []

    def apply(future: Future[Any]) -> int:
        applied.append(future)
        return int(future.result())

    def away() -> int:
        raise ConnectionError("could not connect to the database")

    with pytest.raises(ConnectionError):
        out.send(away, apply)
    assert out.send(lambda: 1, apply) == 1  # the failed call is not applied again
    assert len(applied) == 2
    assert out.answers() == 0
