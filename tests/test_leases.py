"""Partition leases and fencing, on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.instances import created, step
from sco.domain.lifecycle import State, Trigger
from sco.domain.plans import Plan
from sco.ports import FencedOut, Lease, NewRequest, Reservation
from sco_harness.builders import instance, spot_pool

POOL = spot_pool(zone="a")


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(fleet_url)
    s.upsert_pools([POOL])
    yield s
    s.close()


def test_a_lease_has_one_holder_and_a_new_holder_a_larger_token(store: SqlFleetStore) -> None:
    leases = SqlLeases(store.engine)
    a = leases.acquire("p1", "alpha", ttl_s=15, now=100)
    assert a == Lease("p1", "alpha", 1, 115)
    assert leases.acquire("p1", "beta", ttl_s=15, now=110) is None
    again = leases.acquire("p1", "alpha", ttl_s=15, now=110)  # its own: extended, same token
    assert again == Lease("p1", "alpha", 1, 125)
    assert leases.renew(a, ttl_s=15, now=120) == Lease("p1", "alpha", 1, 135)
    b = leases.acquire("p1", "beta", ttl_s=15, now=136)  # expired: taken over
    assert b == Lease("p1", "beta", 2, 151)
    assert leases.renew(a, ttl_s=15, now=137) is None  # the old holder learns it lost
    leases.release(b)
    c = leases.acquire("p1", "alpha", ttl_s=15, now=138)
    assert c is not None
    assert c.token == 3
    assert [x.holder for x in leases.leases()] == ["alpha"]


def test_racing_replicas_get_one_lease(store: SqlFleetStore) -> None:
    leases = SqlLeases(store.engine)
    won: list[Lease] = []
    start = threading.Barrier(8)

    def race(name: str) -> None:
        start.wait()
        got = leases.acquire("p1", name, ttl_s=15, now=100)
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=race, args=(f"r{i}",)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(won) == 1
    assert won[0].token == 1


def test_the_database_refuses_writes_with_a_stale_token(fleet_url: str) -> None:
    old_store = SqlFleetStore(fleet_url)
    old_store.upsert_pools([POOL])
    leases = SqlLeases(old_store.engine)
    old = leases.acquire("p1", "old", ttl_s=15, now=100)
    assert old is not None
    inst = instance(POOL, State.ACTIVE, partition_name="p1")
    old_store.record([created(inst, "mine")], fence=old.token)  # token 1 is current: accepted

    new = leases.acquire("p1", "new", ttl_s=15, now=200)  # the old holder paused; taken over
    assert new is not None
    assert new.token == 2
    new_store = SqlFleetStore(fleet_url)
    try:
        moved = step(inst, Trigger.NODE_JOINED, 201, "joined")
        with pytest.raises(FencedOut, match="stale fencing token"):
            old_store.record([moved], fence=old.token)
        with pytest.raises(FencedOut):
            old_store.save_plan(Plan("p1", 1, 201.0, {POOL.id: 1}, {}), fence=old.token)
        res = Reservation("req-old", POOL.id, "p1", 1, 201, 500)
        version = old_store.pool_records()[POOL.id].version
        with pytest.raises(FencedOut):
            old_store.reserve(NewRequest(res, (), version), fence=old.token)
        # nothing of it landed, and the new holder writes on
        assert new_store.instances("p1") == [inst]
        assert new_store.reservations() == []
        new_store.record([moved], fence=new.token)
        new_store.save_plan(Plan("p1", 1, 202.0, {POOL.id: 1}, {}), fence=new.token)
        # a partition without a lease is not fenced
        other = instance(POOL, State.ACTIVE, partition_name="p2")
        old_store.record([created(other, "unleased partition")], fence=old.token)
    finally:
        old_store.close()
        new_store.close()


def test_heartbeats_say_which_replicas_live(store: SqlFleetStore) -> None:
    leases = SqlLeases(store.engine)
    leases.heartbeat("a", ttl_s=15, now=100)
    leases.heartbeat("b", ttl_s=15, now=100)
    leases.heartbeat("a", ttl_s=15, now=110)
    assert leases.live_replicas(now=114) == ["a", "b"]
    assert leases.live_replicas(now=120) == ["a"]
