"""Node contracts: what a node is told, its versions, written with the transitions that
change them (SQLite and PostgreSQL), its token and its agent's acknowledgements."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import AckStatus, NodeState, terms_of
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.ports import StateConflict
from sco.testing.builders import instance, spot_pool

POOL = spot_pool(zone="a")


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(fleet_url)
    s.upsert_pools([POOL])
    yield s
    s.close()


def _walk(
    store: SqlFleetStore, inst: Instance, *moves: tuple[Trigger, dict[str, object]]
) -> Instance:
    at = 100.0
    for trigger, fields in moves:
        at += 10
        ch = step(inst, trigger, at, str(trigger), **fields)
        store.record([ch])
        inst = ch.after
    return inst


def test_terms_say_what_the_node_needs_and_nothing_else() -> None:
    ready = instance(POOL, State.READY)
    assert terms_of(ready).state is NodeState.SERVING
    assert terms_of(ready).drain_by is None
    noticed = dataclasses.replace(ready, state=State.NOTICED, notice_deadline=500.0)
    assert terms_of(noticed).state is NodeState.LEAVING
    assert terms_of(noticed).drain_by == 500.0, "a notice's deadline is the node's"
    draining = dataclasses.replace(noticed, state=State.DRAINING, drain_by=450.0)
    assert terms_of(draining).drain_by == 450.0
    assert terms_of(dataclasses.replace(ready, reason="anything")) == terms_of(ready)


def test_a_contract_is_written_with_its_transition_and_versioned_by_its_terms(
    store: SqlFleetStore,
) -> None:
    inst = instance(POOL, State.REQUESTED, created_at=100.0)
    store.record([created(inst, "new")])
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.version == 1
    assert c.terms.state is NodeState.JOINING
    inst = _walk(
        store,
        inst,
        (Trigger.CREATE_ACCEPTED, {"server_id": "srv-1"}),  # server id: a new version
        (Trigger.SERVER_ACTIVE, {}),  # still joining: same terms, same version
    )
    c = store.contracts.get(inst.id)
    assert c is not None
    assert (c.version, c.server_id) == (2, "srv-1")
    inst = _walk(store, inst, (Trigger.NODE_JOINED, {}))
    assert store.contracts.get(inst.id).version == 3  # type: ignore[union-attr]
    inst = _walk(store, inst, (Trigger.RECLAIM_NOTICE, {"notice_deadline": 900.0}))
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.version == 4
    assert (c.terms.state, c.terms.drain_by) == (NodeState.LEAVING, 900.0)
    last, changed = store.contracts.changed_since(0)
    assert changed == {inst.id}
    assert last == store.contracts.last_change()
    assert store.contracts.changed_since(last) == (last, set())


def test_a_refused_transition_writes_no_contract(store: SqlFleetStore) -> None:
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    stale = step(inst, Trigger.RECLAIM_NOTICE, 200.0, "n", notice_deadline=300.0)
    store.record([stale])
    before = store.contracts.get(inst.id)
    with pytest.raises(StateConflict):
        store.record([step(inst, Trigger.DRAIN_REQUESTED, 210.0, "stale", drain_by=250.0)])
    assert store.contracts.get(inst.id) == before


def test_tokens_are_found_by_hash_until_they_expire_and_acks_name_a_version(
    store: SqlFleetStore,
) -> None:
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    assert store.contracts.set_token(inst.id, "h" * 64, expires_at=1000.0)
    found = store.contracts.by_token("h" * 64, now=999.0)
    assert found is not None
    assert found.instance_id == inst.id
    assert store.contracts.by_token("h" * 64, now=1000.0) is None, "expired"
    assert store.contracts.by_token("x" * 64, now=0.0) is None
    assert not store.contracts.ack(inst.id, 7, AckStatus.DRAINED, "", 5.0), "not its version"
    assert store.contracts.ack(inst.id, 1, AckStatus.DRAINED, "3 jobs requeued", 5.0)
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.acked is AckStatus.DRAINED
    assert c.ack_detail == "3 jobs requeued"
    _walk(store, inst, (Trigger.RECLAIM_NOTICE, {"notice_deadline": 900.0}))
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.acked is None, "an answer to an older version is not one to this"
