"""Node contracts: what a node is told, its versions, written with the transitions that
change them (SQLite and PostgreSQL), its token and its agent's acknowledgements."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.cli import cli
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.contracts import AckStatus, NodeState, terms_of, token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.engine.builder import NodeTokens
from sco.engine.clock import ManualClock
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import Secret, StateConflict
from sco_harness.builders import instance, spot_pool, write_json_trace, write_yaml
from sco_harness.runners import controller_of, ports_of

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
    assert store.contracts.set_token(inst.id, "h" * 64, expires_at=1000.0, now=0.0)
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


def test_servers_get_tokens_that_rotate(tmp_path: Path) -> None:
    """The controller hands each server a token (the simulated provider keeps it where
    the node would read it), keeps only its digest, and issues a new one after
    `sco tokens rotate`."""
    traces = tmp_path / "traces"
    write_json_trace(traces, "a", [4] * 50, gap_s=600)
    write_yaml(traces / "region.yaml", {"halls": 1, "guaranteed_quota_per_hall": 2})
    demand = write_yaml(
        tmp_path / "demand.yaml",
        {"partitions": [{"name": "p1", "kind": "slurm", "target_units": 2, "max_units": 4}]},
    )
    region = SimRegion(load_traces(traces), SimConfig())
    clock = ManualClock(0.0)
    db = tmp_path / "state.db"
    store = SqlFleetStore(sqlite_url(db))
    store.upsert_pools(region.pools())
    source = FileDemandSource.load(demand, "traces", 0.0)
    tokens = NodeTokens(store.contracts, region, 86400.0, frozenset({"p1"}))
    ports = ports_of(region, region, store, source, clock, tokens=tokens)
    c = controller_of(ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)))
    for t in (0.0, 150.0):
        region.advance_to(t)
        clock.set(t)
        c.cycle()
    servers = [i.server_id for i in store.instances("p1") if i.server_id]
    assert len(servers) == 2
    first = {s: region.node_token(s) for s in servers}
    for i in store.instances("p1"):
        token = first[str(i.server_id)]
        assert token is not None
        found = store.contracts.by_token(token_digest(token.reveal()), now=200.0)
        assert found is not None
        assert found.instance_id == i.id
    done = CliRunner().invoke(cli, ["tokens", "rotate", "--state", str(db), "p1"])
    assert done.exit_code == 0, done.output
    assert "2 tokens revoked" in done.output
    c.cycle()
    for s in servers:
        token = region.node_token(s)
        assert token is not None
        assert token != first[s]
        old = first[s]
        assert old is not None
        assert store.contracts.by_token(token_digest(old.reveal()), now=200.0) is None
    store.close()


def test_the_status_page_shows_each_contract_and_its_agents_answer(
    store: SqlFleetStore,
) -> None:
    """Issue 28: the contracts and the agents' acknowledgements were nowhere to see."""
    from sco.apps.status import status_of

    serving = instance(POOL, State.REQUESTED, created_at=100.0)
    store.record([created(serving, "new")])
    serving = _walk(store, serving, (Trigger.CREATE_ACCEPTED, {"server_id": "srv-1"}),
                    (Trigger.SERVER_ACTIVE, {}), (Trigger.NODE_JOINED, {}))  # fmt: skip
    leaving = dataclasses.replace(instance(POOL, State.REQUESTED, created_at=100.0), id="i-2")
    store.record([created(leaving, "new")])
    leaving = _walk(store, leaving, (Trigger.CREATE_ACCEPTED, {"server_id": "srv-2"}),
                    (Trigger.SERVER_ACTIVE, {}), (Trigger.NODE_JOINED, {}),
                    (Trigger.RECLAIM_NOTICE, {"notice_deadline": 900.0}))  # fmt: skip
    version = store.contracts.get(leaving.id).version  # type: ignore[union-attr]
    assert store.contracts.ack(leaving.id, version, AckStatus.DRAINED, "", 200.0)
    shown = status_of(store, 300.0)["contracts"]
    assert [(c["instance"], c["server"], c["state"], c["reclaim"], c["ack"]) for c in shown] == [
        ("i-2", "srv-2", "leaving", True, "drained"),  # who must leave comes first
        (serving.id, "srv-1", "serving", False, None),
    ]
    assert shown[0]["drain_by"] == 900.0
    assert shown[0]["ack_at"] == 200.0
    from fastapi.testclient import TestClient

    from sco.apps.status import create_app

    page = TestClient(create_app(store, lambda: 300.0)).get("/").text
    assert 'data-field="state">leaving (reclaim)<' in page
    assert 'data-field="ack">drained at 1970-01-01T00:03:20Z<' in page


class _Metadata:
    """Servers' metadata as the provider keeps it: the last token delivered wins. A
    `meanwhile` runs just before the next delivery (a leader paused between storing a
    token and delivering it)."""

    def __init__(self, meanwhile: Callable[[], object] | None = None) -> None:
        self.tokens: dict[str, str] = {}
        self.meanwhile = meanwhile

    def deliver_token(self, server_id: str, token: Secret) -> None:
        if self.meanwhile is not None:
            hook, self.meanwhile = self.meanwhile, None
            hook()
        self.tokens[server_id] = token.reveal()


@pytest.mark.parametrize("paused_s", [10.0, 600.0])
def test_leaders_that_interleave_leave_the_node_a_token_the_store_accepts(
    store: SqlFleetStore, paused_s: float
) -> None:
    """Issue 40, defect 4: delivering a token and storing its digest were separate,
    unfenced steps; a stale leader and a new one interleaved so that the node held one
    token and the store the other's digest, and the agent was refused until renewal
    (15 days by default). Now: stored (fenced) first, delivered, marked delivered. The
    stale leader pauses between storing and delivering; the new one takes the lease and
    issues (within the grace it leaves the undelivered token alone; past it, it issues
    another); the stale one delivers late. Its token is then the current or the
    replaced one: accepted either way. And a stale leader can store nothing more."""
    from sco.adapters.sqlstate.leases import SqlLeases
    from sco.engine.tokens import TokenIssuer
    from sco.ports import FencedOut

    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    leases = SqlLeases(store.engine)
    stale = leases.acquire("p1", "a", 5.0, now=0.0)
    assert stale is not None
    metadata = _Metadata()

    def new_leader_takes_over() -> None:
        at = paused_s
        lease = leases.acquire("p1", "b", 15.0, now=at)
        assert lease is not None
        assert lease.token > stale.token
        TokenIssuer(store.contracts, metadata, 86_400.0).issue("p1", at, lease.token)

    metadata.meanwhile = new_leader_takes_over
    TokenIssuer(store.contracts, metadata, 86_400.0).issue("p1", 0.0, stale.token)
    held = metadata.tokens[str(inst.server_id)]
    assert store.contracts.by_token(token_digest(held), now=paused_s + 1) is not None
    with pytest.raises(FencedOut):
        store.contracts.set_token(inst.id, "x" * 64, 1e9, paused_s + 2, fence=stale.token)
    # The replaced token stays accepted until its own expiry, not after; a revoke
    # ends both.
    c = store.contracts.get(inst.id)
    assert c is not None
    if c.prev_token_hash is not None:
        assert c.accepts(c.prev_token_hash, 86_399.0)
        assert not c.accepts(c.prev_token_hash, 86_400.0)
    assert store.contracts.revoke("p1") == 1
    assert store.contracts.by_token(token_digest(held), now=paused_s + 1) is None
