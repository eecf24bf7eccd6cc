"""SqlFleetStore on SQLite and on PostgreSQL: migrations, compare-and-swap, history,
reservations, plans. Every test runs on both."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import inspect, text

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.domain.plans import Plan, PoolReason
from sco.domain.pools import Pool
from sco.ports import NewRequest, PoolRecord, Reservation, StateConflict
from sco_harness.builders import guaranteed_pool, instance, spot_pool
from sco_harness.postgres import PostgresServer

POOL_A = spot_pool(zone="a")
POOL_B = spot_pool(zone="b")
POOL_G = guaranteed_pool()


@pytest.fixture
def db(fleet_url: str) -> str:
    return fleet_url


@pytest.fixture
def store(db: str) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(db)
    s.upsert_pools([POOL_A, POOL_B, POOL_G])
    yield s
    s.close()


def _requested(pool: Pool, request_id: str, n: int, *, partition: str = "p1") -> list[Instance]:
    out = []
    for _ in range(n):
        i = instance(pool, State.REQUESTED, partition_name=partition, created_at=100.0)
        out.append(dataclasses.replace(i, request_id=request_id, reason=f"for {request_id}"))
    return out


def _request(
    pool: Pool,
    request_id: str,
    n: int,
    version: int,
    *,
    created_at: float = 100.0,
    expires_at: float = 400.0,
    partition: str = "p1",
) -> NewRequest:
    res = Reservation(request_id, pool.id, partition, n, created_at, expires_at)
    return NewRequest(res, tuple(_requested(pool, request_id, n, partition=partition)), version)


def _seed(store: SqlFleetStore, *instances: Instance) -> None:
    store.record([created(i, "seeded") for i in instances])


# ---------------------------------------------------------------- migrations


def test_migrations_run_on_open(db: str) -> None:
    s = SqlFleetStore(db)
    try:
        tables = set(inspect(s.engine).get_table_names())
        assert {"pools", "instances", "instance_history", "reservations", "plans"} <= tables
        assert {"outbox", "event_log", "consumer_offsets", "dead_letters", "exclusions"} <= tables
        assert {"contracts", "contract_changes"} <= tables
        with s.engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0008"
    finally:
        s.close()


def test_without_migrations_nothing_is_created(db: str) -> None:
    s = SqlFleetStore(db, run_migrations=False)
    try:
        assert inspect(s.engine).get_table_names() == []
    finally:
        s.close()


def test_reopening_an_existing_file_keeps_the_data(db: str) -> None:
    first = SqlFleetStore(db)
    first.upsert_pools([POOL_A])
    inst = instance(POOL_A, State.READY)
    first.record([created(inst, "adopted")])
    first.save_plan(Plan("p1", 1, 5.0, {POOL_A.id: 1}, {}))
    first.close()

    second = SqlFleetStore(db)  # migrations run again: must be a no-op
    try:
        assert second.instances("p1") == [inst]
        assert set(second.pool_records()) == {POOL_A.id}
        assert [p.id for p in second.pools()] == [POOL_A.id]
        assert second.pools()[0] == POOL_A
        plan = second.latest_plan("p1")
        assert plan is not None
        assert plan.generation == 1
        assert second.counts().history_rows == 1
    finally:
        second.close()


# ---------------------------------------------------------------- pools


def test_new_pools_start_at_version_zero_with_nothing_reserved(store: SqlFleetStore) -> None:
    records = store.pool_records()
    assert set(records) == {POOL_A.id, POOL_B.id, POOL_G.id}
    for rec in records.values():
        assert rec.version == 0
        assert rec.reserved == 0


def test_upsert_updates_an_existing_pool_and_keeps_its_version(store: SqlFleetStore) -> None:
    store.reserve(_request(POOL_A, "r1", 1, 0))
    cheaper = spot_pool(zone="a", price=0.25)
    store.upsert_pools([cheaper])
    pools = {p.id: p for p in store.pools()}
    assert pools[POOL_A.id].price_per_h == 0.25
    assert len(pools) == 3
    assert store.pool_records()[POOL_A.id].version == 1


def test_replicas_that_start_together_write_the_same_pools_at_once(store: SqlFleetStore) -> None:
    """Every `sco run` replica writes the region's pools at start; two that started
    together both read a pool as new and the second INSERT crashed its replica
    (found by CI: the control-plane bench's second replica never came up)."""
    pools = [spot_pool(zone=f"z{i}") for i in range(30)]
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def write() -> None:
        start.wait()
        try:
            store.upsert_pools(pools)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert {p.id for p in pools} <= set(store.pool_records())


def test_pool_records_sum_reservations_per_pool(store: SqlFleetStore) -> None:
    store.reserve(_request(POOL_A, "r1", 2, 0))
    store.reserve(_request(POOL_A, "r2", 3, 1))
    store.reserve(_request(POOL_B, "r3", 1, 0))
    records = store.pool_records()
    assert records[POOL_A.id].version == 2
    assert records[POOL_A.id].reserved == 5
    assert records[POOL_B.id].version == 1
    assert records[POOL_B.id].reserved == 1
    assert records[POOL_G.id].version == 0
    assert records[POOL_G.id].reserved == 0


# ---------------------------------------------------------------- reserve


def test_reserve_writes_reservation_records_and_history(store: SqlFleetStore) -> None:
    req = _request(POOL_A, "r1", 3, 0)
    store.reserve(req)

    assert store.reservations() == [req.reservation]
    got = {i.id: i for i in store.instances("p1")}
    assert got == {i.id: i for i in req.instances}
    assert all(i.state is State.REQUESTED for i in got.values())
    assert store.pool_records()[POOL_A.id].version == 1

    rows = store.history()
    assert len(rows) == 3
    assert {r.instance_id for r in rows} == set(got)
    for r in rows:
        assert r.from_state is None
        assert r.to_state == State.REQUESTED.value
        assert r.trigger is None
        assert r.pool == POOL_A.id
        assert r.partition == "p1"
        assert r.at == 100.0
        assert r.reason == "for r1"


def test_reserve_with_stale_pool_version_conflicts_and_writes_nothing(
    store: SqlFleetStore,
) -> None:
    store.reserve(_request(POOL_A, "r1", 1, 0))
    before = store.counts()

    stale = _request(POOL_A, "r2", 2, 0)  # another writer already moved the pool to 1
    with pytest.raises(StateConflict):
        store.reserve(stale)

    assert store.counts() == before
    assert [r.request_id for r in store.reservations()] == ["r1"]
    assert store.pool_records()[POOL_A.id] == PoolRecord(version=1, reserved=1)
    assert not {i.id for i in stale.instances} & {i.id for i in store.instances("p1")}
    assert all(r.instance_id not in {i.id for i in stale.instances} for r in store.history())


def test_reserve_in_an_unknown_pool_conflicts(store: SqlFleetStore) -> None:
    other = spot_pool(hall="hall-9")
    with pytest.raises(StateConflict):
        store.reserve(_request(other, "r1", 1, 0))
    assert store.counts().reservations == 0


def test_reserve_without_records_writes_only_the_reservation(store: SqlFleetStore) -> None:
    res = Reservation("r0", POOL_A.id, "p1", 1, 0.0, 10.0)
    store.reserve(NewRequest(res, (), 0))
    assert store.reservations() == [res]
    assert store.counts().history_rows == 0


def test_two_writers_cannot_spend_the_same_pool_version(db: str, store: SqlFleetStore) -> None:
    other = SqlFleetStore(db)
    try:
        version = store.pool_records()[POOL_A.id].version
        assert other.pool_records()[POOL_A.id].version == version
        store.reserve(_request(POOL_A, "mine", 1, version))
        with pytest.raises(StateConflict):
            other.reserve(_request(POOL_A, "theirs", 1, version))
        assert [r.request_id for r in other.reservations()] == ["mine"]
    finally:
        other.close()


# ---------------------------------------------------------------- record


def test_record_moves_a_record_along_with_one_history_row(store: SqlFleetStore) -> None:
    req = _request(POOL_A, "r1", 1, 0)
    store.reserve(req)
    inst = req.instances[0]

    ch = step(inst, Trigger.CREATE_ACCEPTED, 110.0, "accepted", server_id="srv-9")
    store.record([ch])

    (now,) = store.instances("p1")
    assert now == ch.after
    assert now.state is State.CREATING
    assert now.version == inst.version + 1
    assert now.server_id == "srv-9"
    rows = store.history(inst.id)
    assert [(r.from_state, r.to_state, r.trigger) for r in rows] == [
        (None, "requested", None),
        ("requested", "creating", "create_accepted"),
    ]
    assert rows[1].at == 110.0
    assert rows[1].reason == "accepted"


def test_every_change_of_a_batch_adds_exactly_one_history_row(store: SqlFleetStore) -> None:
    a = instance(POOL_A, State.ACTIVE)
    b = instance(POOL_B, State.READY)
    c = instance(POOL_G, State.CREATING)
    _seed(store, a, b, c)
    assert store.counts().history_rows == 3

    changes = [
        step(a, Trigger.NODE_JOINED, 50.0, "joined"),
        step(b, Trigger.RECLAIM_NOTICE, 51.0, "notice", notice_deadline=171.0),
        step(c, Trigger.SERVER_ERROR, 52.0, "boom"),
    ]
    store.record(changes)

    assert store.counts().history_rows == 6
    last = store.history()[3:]
    assert [(r.instance_id, r.from_state, r.to_state, r.trigger, r.at) for r in last] == [
        (a.id, "active", "ready", "node_joined", 50.0),
        (b.id, "ready", "noticed", "reclaim_notice", 51.0),
        (c.id, "creating", "failed", "server_error", 52.0),
    ]
    by_id = {i.id: i for i in store.instances("p1")}
    assert by_id[a.id].ready_at == 50.0
    assert by_id[b.id].notice_deadline == 171.0
    assert by_id[c.id].state is State.FAILED


def test_a_batch_may_move_a_record_more_than_once(store: SqlFleetStore) -> None:
    new = instance(POOL_A, State.REQUESTED)
    made = created(new, "new")
    accepted = step(made.after, Trigger.CREATE_ACCEPTED, 5.0, "accepted", server_id="s-1")
    active = step(accepted.after, Trigger.SERVER_ACTIVE, 6.0, "active")
    store.record([made, accepted, active])

    assert store.instance(new.id) == active.after
    assert [r.to_state for r in store.history(new.id)] == ["requested", "creating", "active"]
    # A second change that does not follow the first is a conflict, and nothing is kept.
    again = step(active.after, Trigger.NODE_JOINED, 7.0, "joined")
    other = step(active.after, Trigger.SERVER_ERROR, 7.0, "boom")
    with pytest.raises(StateConflict):
        store.record([again, other])
    assert store.instance(new.id) == active.after
    assert len(store.history(new.id)) == 3


def test_a_self_loop_still_adds_a_history_row(store: SqlFleetStore) -> None:
    inst = instance(POOL_A, State.TERMINATING)
    _seed(store, inst)
    store.record([step(inst, Trigger.DELETE_RESENT, 9.0, "again")])
    rows = store.history(inst.id)
    assert [(r.from_state, r.to_state, r.trigger) for r in rows][-1] == (
        "terminating",
        "terminating",
        "delete_resent",
    )
    got = store.instance(inst.id)
    assert got is not None
    assert got.version == inst.version + 1


def test_stale_change_conflicts_and_rolls_back_the_whole_batch(store: SqlFleetStore) -> None:
    a = instance(POOL_A, State.ACTIVE)
    b = instance(POOL_A, State.READY)
    _seed(store, a, b)
    store.record([step(b, Trigger.RECLAIM_NOTICE, 10.0, "first writer")])  # b is now v2
    rows_before = store.history()
    counts_before = store.counts()

    fresh = step(a, Trigger.NODE_JOINED, 20.0, "ok")
    new = instance(POOL_B, State.REQUESTED)
    stale = step(b, Trigger.DRAIN_REQUESTED, 20.0, "second writer", drain_by=99.0)  # from v1
    with pytest.raises(StateConflict):
        store.record([fresh, created(new, "new"), stale])

    assert store.history() == rows_before
    assert store.counts() == counts_before
    assert store.instance(a.id) == a  # the good change before the stale one was undone
    assert store.instance(new.id) is None
    got_b = store.instance(b.id)
    assert got_b is not None
    assert got_b.state is State.NOTICED
    assert got_b.drain_by is None


def test_chained_changes_of_one_record_in_one_batch_apply_in_order(
    store: SqlFleetStore,
) -> None:
    """A sync may move a record twice in one cycle (CREATING to ACTIVE to READY): the
    batched compare-and-swap applies them in order, each on the version before it."""
    a = instance(POOL_A, State.CREATING)
    other = instance(POOL_B, State.ACTIVE)
    _seed(store, a, other)
    first = step(a, Trigger.SERVER_ACTIVE, 5.0, "active")
    second = step(first.after, Trigger.NODE_JOINED, 5.0, "joined")
    store.record([first, step(other, Trigger.NODE_JOINED, 5.0, "joined"), second])
    got = store.instance(a.id)
    assert got is not None
    assert (got.state, got.version) == (State.READY, a.version + 2)
    assert [r.to_state for r in store.history(a.id)][-2:] == ["active", "ready"]


def test_stale_change_keeps_reservations_of_the_batch(store: SqlFleetStore) -> None:
    req = _request(POOL_A, "r1", 2, 0)
    store.reserve(req)
    a, b = req.instances
    store.record([step(b, Trigger.CREATE_FAILED, 5.0, "refused")])
    with pytest.raises(StateConflict):
        store.record(
            [step(a, Trigger.CREATE_ACCEPTED, 6.0, "ok"), step(b, Trigger.EXPIRED, 6.0, "stale")],
            settle={"r1": 0},
        )
    assert [r.count for r in store.reservations()] == [2]
    assert store.instance(a.id) == a


def test_recording_a_record_that_does_not_exist_conflicts(store: SqlFleetStore) -> None:
    ghost = instance(POOL_A, State.READY)
    with pytest.raises(StateConflict):
        store.record([step(ghost, Trigger.DRAIN_REQUESTED, 1.0, "x")])
    assert store.counts().history_rows == 0


def test_record_nothing_is_a_no_op(store: SqlFleetStore) -> None:
    store.record([])
    assert store.counts().history_rows == 0


# ---------------------------------------------------------------- settle


def test_record_settles_reservations_in_the_same_transaction(store: SqlFleetStore) -> None:
    r1 = _request(POOL_A, "r1", 3, 0)
    r2 = _request(POOL_A, "r2", 2, 1)
    store.reserve(r1)
    store.reserve(r2)
    assert store.pool_records()[POOL_A.id].reserved == 5

    accepted = [step(i, Trigger.CREATE_ACCEPTED, 120.0, "ok") for i in r1.instances[:2]]
    store.record(accepted, settle={"r1": 1, "r2": 0})

    assert [(r.request_id, r.count) for r in store.reservations()] == [("r1", 1)]
    assert store.pool_records()[POOL_A.id].reserved == 1
    states = {i.id: i.state for i in store.instances("p1")}
    assert [states[i.id] for i in r1.instances] == [
        State.CREATING,
        State.CREATING,
        State.REQUESTED,
    ]


def test_settle_only_without_changes(store: SqlFleetStore) -> None:
    store.reserve(_request(POOL_A, "r1", 3, 0))
    history = store.counts().history_rows
    store.record([], settle={"r1": 2})
    assert [r.count for r in store.reservations()] == [2]
    store.settle_reservation("r1", 0)
    assert store.reservations() == []
    assert store.counts().history_rows == history


# ---------------------------------------------------------------- sweep


def test_sweep_drops_only_expired_reservations(store: SqlFleetStore) -> None:
    store.reserve(_request(POOL_A, "early", 1, 0, expires_at=100.0))
    store.reserve(_request(POOL_A, "late", 1, 1, expires_at=300.0))
    store.reserve(_request(POOL_B, "later", 1, 0, expires_at=500.0))

    assert store.sweep_reservations(50.0) == 0
    assert len(store.reservations()) == 3
    assert store.sweep_reservations(299.0) == 1
    assert sorted(r.request_id for r in store.reservations()) == ["late", "later"]
    assert store.sweep_reservations(1000.0) == 2
    assert store.reservations() == []
    # Sweeping touches reservations only: the records they were for stay.
    assert len(store.instances("p1")) == 3


# ---------------------------------------------------------------- plans


def test_plan_round_trip_and_latest_generation(store: SqlFleetStore) -> None:
    assert store.latest_plan("p1") is None
    one = Plan("p1", 1, 10.0, {POOL_A.id: 2, POOL_B.id: 0}, {POOL_G.id: 1}, ("first",))
    two = Plan("p1", 2, 20.0, {POOL_B.id: 3}, {}, ("second", "why"))
    other = Plan("p2", 7, 15.0, {POOL_A.id: 1}, {}, ())
    store.save_plan(one)
    store.save_plan(two)
    store.save_plan(other)

    assert store.latest_plan("p1") == two
    assert store.latest_plan("p2") == other
    assert store.latest_plan("p3") is None
    assert store.counts().plans == 3


def test_plan_terms_that_are_not_finite_survive_the_round_trip(store: SqlFleetStore) -> None:
    why = PoolReason(1, 0, 3, 0.5, {"age": 0.25, "history": math.inf}, ("degraded",))
    plan = Plan("p1", 1, 10.0, {POOL_A.id: 1}, {}, ("a",), {POOL_A.id: why}, {"spare": math.nan})
    store.save_plan(plan)
    got = store.latest_plan("p1")
    assert got is not None
    assert got.pools == {POOL_A.id: why}
    assert math.isnan(got.terms["spare"])


def test_plan_mappings_survive_the_round_trip(store: SqlFleetStore) -> None:
    plan = Plan("p1", 1, 10.0, {POOL_A.id: 2, POOL_B.id: 0}, {POOL_G.id: 1}, ("a", "b"))
    store.save_plan(plan)
    got = store.latest_plan("p1")
    assert got is not None
    assert dict(got.spot) == {POOL_A.id: 2, POOL_B.id: 0}
    assert dict(got.guaranteed) == {POOL_G.id: 1}
    assert got.notes == ("a", "b")
    assert got.created_at == 10.0


def test_saving_an_existing_generation_conflicts(store: SqlFleetStore) -> None:
    store.save_plan(Plan("p1", 1, 10.0, {POOL_A.id: 2}, {}))
    with pytest.raises(StateConflict):
        store.save_plan(Plan("p1", 1, 11.0, {POOL_A.id: 5}, {}))
    got = store.latest_plan("p1")
    assert got is not None
    assert dict(got.spot) == {POOL_A.id: 2}
    assert store.counts().plans == 1
    store.save_plan(Plan("p2", 1, 10.0, {}, {}))  # same generation, other partition: fine


# ---------------------------------------------------------------- reading back


def test_instances_exclude_gone_and_other_partitions(store: SqlFleetStore) -> None:
    leaving = instance(POOL_A, State.TERMINATING)
    failed = instance(POOL_A, State.FAILED)
    ready = instance(POOL_A, State.READY)
    elsewhere = instance(POOL_A, State.READY, partition_name="p2")
    _seed(store, leaving, failed, ready, elsewhere)
    store.record([step(leaving, Trigger.SERVER_GONE, 30.0, "gone")])

    assert {i.id for i in store.instances("p1")} == {failed.id, ready.id}
    assert [i.id for i in store.instances("p2")] == [elsewhere.id]
    assert store.instances("nobody") == []
    gone = store.instance(leaving.id)
    assert gone is not None
    assert gone.state is State.GONE


def test_counts(store: SqlFleetStore) -> None:
    assert store.counts().instances_by_state == {}
    store.reserve(_request(POOL_A, "r1", 2, 0))
    a = instance(POOL_B, State.READY)
    b = instance(POOL_B, State.TERMINATING)
    _seed(store, a, b)
    store.record([step(b, Trigger.SERVER_GONE, 40.0, "gone")])
    store.save_plan(Plan("p1", 1, 1.0, {}, {}))

    counts = store.counts()
    assert dict(counts.instances_by_state) == {"requested": 2, "ready": 1, "gone": 1}
    assert counts.history_rows == 5
    assert counts.plans == 1
    assert counts.reservations == 1


def test_postgres_url_with_several_hosts_finds_the_writable_one(postgres: PostgresServer) -> None:
    """The form a Patroni cluster is used with: every member listed, and libpq picks
    the one that accepts writes. Here the first member is down."""
    url = postgres.new_database()
    database = url.rsplit("/", 1)[1]
    down = PostgresServer.free_port()
    many = (
        f"postgresql+psycopg://postgres@/{database}?host=127.0.0.1:{down}"
        f"&host=127.0.0.1:{postgres.port}&target_session_attrs=read-write"
    )
    s = SqlFleetStore(many)
    try:
        s.upsert_pools([POOL_A])
        assert set(s.pool_records()) == {POOL_A.id}
    finally:
        s.close()


def test_replicas_starting_together_migrate_once(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            SqlFleetStore(url).close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=open_store, daemon=True) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "migrations deadlocked"
    assert errors == []
