"""Node contracts' rules, once, over every implementation: `SqlFleetStore`'s
contracts (`ContractStore`) on SQLite and on PostgreSQL, and the lab's twin
`MemoryContracts` written by `MemoryFleetStore`. A contract is written with the
transition that changes its terms, its token is stored fenced before it is
delivered, and a node holding any token it may hold is served."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import AckStatus, NodeState, token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.engine.tokens import TokenIssuer
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import FencedOut, LeaseStore, ProviderError, Secret, StateConflict
from sco_harness.builders import instance, spot_pool

POOL = spot_pool(zone="a")


@pytest.fixture(params=["sqlite", "postgresql", "memory"])
def opened(
    request: pytest.FixtureRequest, database_url: Callable[[str], str]
) -> Iterator[tuple[Any, LeaseStore]]:
    """(fleet state whose transitions write contracts, its lease table)."""
    store: Any
    if request.param == "memory":
        store = MemoryFleetStore(contracts=True)
        leases: LeaseStore = store.leases
    else:
        store = SqlFleetStore(database_url(request.param))
        leases = SqlLeases(store.engine)
    store.upsert_pools([POOL])
    yield store, leases
    store.close()


@pytest.fixture
def store(opened: tuple[Any, LeaseStore]) -> Any:
    return opened[0]


@pytest.fixture
def leases(opened: tuple[Any, LeaseStore]) -> LeaseStore:
    return opened[1]


def _walk(store: Any, inst: Instance, *moves: tuple[Trigger, dict[str, object]]) -> Instance:
    at = 100.0
    for trigger, fields in moves:
        at += 10
        ch = step(inst, trigger, at, str(trigger), **fields)
        store.record([ch])
        inst = ch.after
    return inst


def test_a_contract_is_written_with_its_transition_and_versioned_by_its_terms(
    store: Any,
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


def test_a_refused_transition_writes_no_contract(store: Any) -> None:
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    stale = step(inst, Trigger.RECLAIM_NOTICE, 200.0, "n", notice_deadline=300.0)
    store.record([stale])
    before = store.contracts.get(inst.id)
    with pytest.raises(StateConflict):
        store.record([step(inst, Trigger.DRAIN_REQUESTED, 210.0, "stale", drain_by=250.0)])
    assert store.contracts.get(inst.id) == before


def test_tokens_are_found_by_hash_until_they_expire_and_acks_name_a_version(
    store: Any,
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
    store: Any, leases: LeaseStore, paused_s: float
) -> None:
    """Issue 40, defect 4: delivering a token and storing its digest were separate,
    unfenced steps; a stale leader and a new one interleaved so that the node held one
    token and the store the other's digest, and the agent was refused until renewal
    (15 days by default). Now: stored (fenced) first, delivered, marked delivered. The
    stale leader pauses between storing and delivering; the new one takes the lease and
    issues (within the grace it leaves the undelivered token alone; past it, it issues
    another); the stale one delivers late. Its token is then the current or the
    replaced one: accepted either way. And a stale leader can store nothing more."""
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
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


def test_a_token_written_away_from_its_server_is_issued_again(
    store: Any, leases: LeaseStore
) -> None:
    """Regression (a loaded test run): Nova writes a server's metadata whole, and a
    reclaim notice set as sco handed a new server its token wrote the token away; the
    node had none until the renewal, half a day on. A server listed without the token
    handed it in an earlier cycle gets a new one; the cycle that hands one over read
    its listing before, so that listing's word does not count."""
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    lease = leases.acquire("p1", "a", 30.0, now=0.0)
    assert lease is not None
    metadata = _Metadata()
    issuer = TokenIssuer(store.contracts, metadata, 86_400.0)
    sid = str(inst.server_id)
    assert issuer.issue("p1", 0.0, lease.token, tokenless={sid: inst.id}) == 1, "its first"
    assert issuer.issue("p1", 0.0, lease.token, tokenless={sid: inst.id}) == 0, "listed before"
    first = metadata.tokens[sid]
    assert issuer.issue("p1", 10.0, lease.token) == 0, "on its server: nothing to do"
    del metadata.tokens[sid]  # another write to the server's metadata took it
    assert issuer.issue("p1", 20.0, lease.token, tokenless={sid: inst.id}) == 1
    assert metadata.tokens[sid] != first
    assert store.contracts.by_token(token_digest(metadata.tokens[sid]), now=21.0) is not None
    assert issuer.issue("p1", 30.0, lease.token) == 0, "once"


def test_a_token_a_former_leader_handed_over_and_written_away_is_issued_again(
    store: Any, leases: LeaseStore
) -> None:
    """A new leader did not know the tokens its predecessor handed over, so one written
    away just before the failover waited for the renewal, half a token's life on. A
    server listed without a token in two listings running, whose token fleet state
    does not queue, gets a new one (one listing could predate a handover)."""
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    old = leases.acquire("p1", "a", 30.0, now=0.0)
    assert old is not None
    metadata = _Metadata()
    sid = str(inst.server_id)
    assert TokenIssuer(store.contracts, metadata, 86_400.0).issue("p1", 0.0, old.token) == 1
    del metadata.tokens[sid]  # another write to the server's metadata took it
    new = leases.acquire("p1", "b", 30.0, now=40.0)
    assert new is not None
    issuer = TokenIssuer(store.contracts, metadata, 86_400.0)
    assert issuer.issue("p1", 40.0, new.token, tokenless={sid: inst.id}) == 0, "one sight"
    assert issuer.issue("p1", 70.0, new.token, tokenless={sid: inst.id}) == 1
    assert store.contracts.by_token(token_digest(metadata.tokens[sid]), now=71.0) is not None
    assert issuer.issue("p1", 100.0, new.token) == 0, "on its server: nothing to do"


def test_a_token_the_cloud_refused_is_tried_again_at_the_next_listing_without_it(
    store: Any, leases: LeaseStore
) -> None:
    """Found by the tour on a loaded run: Nova refuses metadata while a server builds
    (409), and the token was tried again only after the grace, a minute on; the
    reclaimer had picked that young server, and its agent never started before the
    deadline. The issuer knows it delivers nothing else to that server, so a server
    listed without a token again gets one at once; with no listing to say so, the
    ledger's grace still brings it back."""
    inst, other = instance(POOL, State.READY), instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    lease = leases.acquire("p1", "a", 30.0, now=0.0)
    assert lease is not None
    metadata = _Outage()
    metadata.down = True
    issuer = TokenIssuer(store.contracts, metadata, 86_400.0, undelivered_grace_s=60.0)
    sid = str(inst.server_id)
    assert issuer.issue("p1", 0.0, lease.token, tokenless={sid: inst.id}) == 0, "refused"
    metadata.down = False
    assert issuer.issue("p1", 5.0, lease.token, tokenless={sid: inst.id}) == 1, "not in 60 s"
    assert store.contracts.by_token(token_digest(metadata.tokens[sid]), now=6.0) is not None
    away = _Outage()
    quiet = TokenIssuer(store.contracts, away, 86_400.0, undelivered_grace_s=60.0)
    away.down = True
    store.record([created(other, "seeded")], fence=lease.token)
    assert quiet.issue("p1", 10.0, lease.token) == 0
    away.down = False
    assert quiet.issue("p1", 40.0, lease.token) == 0, "no listing said: the grace"
    assert quiet.issue("p1", 75.0, lease.token) == 1, "past it"


class _Outage(_Metadata):
    """Servers' metadata behind a cloud API that is away while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def deliver_token(self, server_id: str, token: Secret) -> None:
        if self.down:
            raise ProviderError("set metadata: 503 from Nova")
        super().deliver_token(server_id, token)


def test_a_renewal_the_cloud_did_not_take_leaves_the_node_its_token(
    store: Any, leases: LeaseStore
) -> None:
    """Found by the swarm (issue 40): a renewal whose delivery failed left the new token
    current and undelivered; past the grace the next cycle stored another, which
    replaced the undelivered one, and the token the node held was dropped: its agent
    was refused until the cloud took a delivery again. The token last seen delivered
    stays accepted until its own expiry."""
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    lease = leases.acquire("p1", "a", 30.0, now=0.0)
    assert lease is not None
    metadata = _Outage()
    issuer = TokenIssuer(store.contracts, metadata, 1000.0, undelivered_grace_s=60.0)
    assert issuer.issue("p1", 0.0, lease.token) == 1
    held = token_digest(metadata.tokens[str(inst.server_id)])
    metadata.down = True
    for at in range(510, 900, 30):  # renewals due from 500 s; the cloud away throughout
        issuer.issue("p1", float(at), lease.token)
        assert store.contracts.by_token(held, now=float(at)) is not None, at
    assert store.contracts.by_token(held, now=1000.0) is None, "not past its own expiry"
    metadata.down = False
    assert issuer.issue("p1", 960.0, lease.token) == 1, "past the grace: issued again"
    now_held = token_digest(metadata.tokens[str(inst.server_id)])
    assert store.contracts.by_token(now_held, now=1500.0) is not None
    assert store.contracts.revoke("p1") == 1
    assert store.contracts.by_token(held, now=961.0) is None, "a revoke ends every token"


def test_the_change_log_names_what_changed_and_current_keeps_the_recently_gone(
    store: Any,
) -> None:
    a = instance(POOL, State.READY)
    store.record([created(a, "seeded")])
    first, changed = store.contracts.changed_since(0)
    assert changed == {a.id}
    assert store.contracts.set_token(a.id, "h" * 64, 1000.0, 0.0)
    last, changed = store.contracts.changed_since(first)
    assert (last > first, changed) == (True, {a.id}), "a token set is a change"
    assert store.contracts.changed_since(last) == (last, set())
    gone = _walk(store, a, (Trigger.SERVER_VANISHED, {}))
    assert gone.state is State.GONE
    assert store.contracts.get(a.id).terms.state is NodeState.GONE
    assert [c.instance_id for c in store.contracts.current(gone_since=0.0)] == [a.id]
    assert store.contracts.current(gone_since=1e12) == []
    assert [c.instance_id for c in store.contracts.of_partition(a.partition)] == [a.id]
    assert store.contracts.untokened(a.partition, 1e12, 1e12) == [], "gone: no token"


def test_only_a_drained_answer_to_the_leaving_version_counts(store: Any) -> None:
    a = instance(POOL, State.READY)
    store.record([created(a, "seeded")])
    v = store.contracts.get(a.id).version
    assert store.contracts.ack(a.id, v, AckStatus.DRAINED, "", 1.0)
    assert store.contracts.drained_servers(a.partition) == set(), "not leaving"
    a = _walk(store, a, (Trigger.RECLAIM_NOTICE, {"notice_deadline": 900.0}))
    v = store.contracts.get(a.id).version
    assert store.contracts.ack(a.id, v, AckStatus.DRAINED, "", 2.0)
    assert store.contracts.drained_servers(a.partition) == {a.server_id}
