"""Fleet state's rules, once, over every implementation: `SqlFleetStore` with
`SqlLeases` (its fencing) on SQLite and on PostgreSQL, and the lab's twins
`MemoryFleetStore` with `MemoryLeaseTable`.

The rules are a small model of what the ports promise (`FleetStore`, `FleetAudit`,
`Fencing`): records and their versions, pools and their reservations, the outbox,
exclusions, scores, plans, pool ages, intents, every transition in the order
written, and the fencing token every write of a partition carries. Hypothesis drives
it with random operations, stale writes and stale tokens among them, and checks the
implementation's answers against the model after each step. The scenarios after it
walk the same machine through the fencing rules by name.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.events import LifecycleEvent
from sco.domain.instances import Change, Instance, created, step
from sco.domain.lifecycle import EDGES, LIVE, State, Trigger
from sco.domain.plans import Plan
from sco.domain.pools import Pool
from sco.domain.signals import Exclusion, ExclusionState, PoolScore
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import (
    FencedOut,
    FleetAudit,
    FleetStore,
    HistoryRow,
    LeaseStore,
    NewRequest,
    Reservation,
    StateConflict,
)
from sco_harness.builders import spot_pool

POOLS = [spot_pool(hall="h1", zone="a"), spot_pool(hall="h2", zone="b")]
LEASED = ["p1", "p2"]  # partitions whose leaders take leases (from the first one taken)
UNLEASED = "p3"  # never leased: every token writes it
PARTITIONS = [*LEASED, UNLEASED]
HOLDERS = ["r1", "r2", "r3"]
TTL_S = 10.0
_n = itertools.count(1)


class AuditedStore(FleetStore, FleetAudit, Protocol):
    """Fleet state with the auditor's reads."""


def _new(pool: Pool, partition: str, at: float) -> Instance:
    k = next(_n)
    return Instance(
        id=f"i{k}", partition=partition, pool=pool.id, capacity_class=pool.capacity_class,
        units=1, state=State.REQUESTED, version=1, request_id=f"r{k}", plan_generation=1,
        created_at=at, state_since=at,
    )  # fmt: skip


def _event(key: str, pool: Pool, at: float) -> LifecycleEvent:
    return LifecycleEvent(
        event_id=key, at=at, partition="p1", pool=pool.id, instance="i0",
        kind="headroom_sample", reason="sampled",
    )  # fmt: skip


def _score(pool: Pool, at: float, value: float) -> PoolScore:
    return PoolScore(
        pool=pool.id, generation=0, computed_at=at, hazard_per_h=0.1, exposure_h=1.0,
        reclaims=0, survival=0.9, success_ratio=1.0, attempts=1, ready_p50_s=None,
        ready_n=0, headroom=None, headroom_n=0, value=value, why="",
    )  # fmt: skip


def _row(ch: Change) -> HistoryRow:
    """The history row a change writes."""
    return HistoryRow(
        instance_id=ch.after.id, partition=ch.after.partition, pool=ch.after.pool, at=ch.at,
        from_state=ch.before.state.value if ch.before else None, to_state=ch.after.state.value,
        trigger=ch.trigger.value if ch.trigger else None, reason=ch.reason, code=ch.code or None,
    )  # fmt: skip


# ---------------------------------------------------------------- implementations

Opened = tuple[AuditedStore, LeaseStore, Callable[[], None]]
Factory = Callable[[], Opened]


def _sql(url: str) -> Opened:
    store = SqlFleetStore(url, contracts=False)
    return store, SqlLeases(store.engine), store.close


def _memory() -> Opened:
    store = MemoryFleetStore()
    return store, store.leases, store.close


@dataclass(frozen=True)
class Implementation:
    open: Factory  # an empty fleet state with its fencing, each time it is called
    examples: int  # how many runs of the machine: the twin's cost next to nothing


@pytest.fixture(params=["sqlite", "postgresql", "memory"])
def impl(request: pytest.FixtureRequest, database_url: Callable[[str], str]) -> Implementation:
    if request.param == "memory":
        return Implementation(_memory, examples=200)
    kind: str = request.param
    return Implementation(lambda: _sql(database_url(kind)), examples=25)


class FleetStateRules(RuleBasedStateMachine):
    """The fleet-state ports' semantics, as a model the store must agree with."""

    make: Factory

    def __init__(self) -> None:
        super().__init__()
        self.store, self.leases, self.close = self.make()
        self.store.upsert_pools(POOLS)
        self.now = 1000.0
        self.model: dict[str, Instance] = {}  # every record as last written, gone ones too
        self.older: list[Instance] = []  # copies read before a later write: stale
        self.history: list[HistoryRow] = []
        self.reclaims: list[tuple[str, str, float]] = []
        self.versions = {p.id: 0 for p in POOLS}
        self.reserved: dict[str, Reservation] = {}
        self.outbox: list[str] = []
        self.exclusions: dict[str, Exclusion] = {}
        self.scores: dict[int, dict[str, float]] = {}
        self.plans: dict[str, int] = {}
        self.ages: dict[str, float | None] = {p.id: None for p in POOLS}
        self.intents: dict[str, str] = {}
        # Fencing: each leased partition's row (holder, the largest token it was taken
        # or claimed with), and the leases' clock.
        self.fences: dict[str, tuple[str, int]] = {}
        self.live_until: dict[str, float] = {}  # until when its lease or claim holds
        self.lease_now = 0.0

    def teardown(self) -> None:
        self.close()

    def _tick(self) -> float:
        self.now += 7.0
        return self.now

    def fence(self, partition: str, spare: int = 0) -> int:
        """The token the partition's leader writes with; a partition without a lease
        takes any (`spare`)."""
        held = self.fences.get(partition)
        return held[1] if held is not None else spare

    def _recorded(self, changes: list[Change]) -> None:
        for ch in changes:
            if ch.before is not None:
                self.older.append(ch.before)
            self.model[ch.after.id] = ch.after
            self.history.append(_row(ch))
            self.outbox.append(f"{ch.after.id}:{ch.after.version}")
            if ch.trigger in (Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED):
                self.reclaims.append((ch.after.pool, ch.after.id, ch.at))

    def _moves(self, partition: str, which: int, pick: int, batch: int) -> list[Change]:
        """Changes from the versions held, of one partition's records, several at once
        (one record more than once in a batch); a server id from the first move on."""
        ids = sorted(k for k, i in self.model.items() if i.partition == partition)
        changes: list[Change] = []
        latest: dict[str, Instance] = {}
        for k in range(batch if ids else 0):
            key = ids[(which + k // 2) % len(ids)]
            current = latest.get(key, self.model[key])
            moves = [t for (s, t) in EDGES if s is current.state]
            if not moves:
                continue
            ch = step(
                current, moves[(pick + k) % len(moves)], self._tick(), "observed",
                server_id=current.server_id or f"srv-{key}",
            )  # fmt: skip
            changes.append(ch)
            latest[key] = ch.after
        return changes

    # ------------------------------------------------------------ records

    @rule(
        pool=st.sampled_from(POOLS), partition=st.sampled_from(PARTITIONS), spare=st.integers(0, 9)
    )
    def create(self, pool: Pool, partition: str, spare: int) -> None:
        ch = created(_new(pool, partition, self._tick()), "asked")
        self.store.record([ch], fence=self.fence(partition, spare))
        self._recorded([ch])

    @rule(
        partition=st.sampled_from(PARTITIONS),
        which=st.integers(0, 10**6),
        pick=st.integers(0, 20),
        batch=st.integers(1, 3),
        spare=st.integers(0, 9),
    )
    def move(self, partition: str, which: int, pick: int, batch: int, spare: int) -> None:
        """Records move along the table from the version read."""
        changes = self._moves(partition, which, pick, batch)
        self.store.record(changes, fence=self.fence(partition, spare))
        self._recorded(changes)

    @precondition(lambda self: bool(self.older))
    @rule(which=st.integers(0, 10**6), pool=st.sampled_from(POOLS))
    def stale_write_is_refused_whole(self, which: int, pool: Pool) -> None:
        """A batch with one change from a version no longer held writes nothing, and a
        record is created once."""
        old = self.older[which % len(self.older)]
        fence = self.fence(old.partition)
        moves = [t for (s, t) in EDGES if s is old.state]
        good = created(_new(pool, old.partition, self._tick()), "would be new")
        if moves:
            bad = step(old, moves[0], self.now, "from a stale read")
            with pytest.raises(StateConflict):
                self.store.record([good, bad], fence=fence)
        with pytest.raises(StateConflict):
            self.store.record([created(self.model[old.id], "created twice")], fence=fence)

    # ------------------------------------------------------------ reservations

    @rule(
        pool=st.sampled_from(POOLS),
        count=st.integers(1, 3),
        stale=st.booleans(),
        spare=st.integers(0, 9),
    )
    def reserve(self, pool: Pool, count: int, stale: bool, spare: int) -> None:
        at = self._tick()
        instances = tuple(_new(pool, "p2", at) for _ in range(count))
        res = Reservation(instances[0].request_id, pool.id, "p2", count, at, at + 50.0)
        version = self.versions[pool.id] - (1 if stale else 0)
        request = NewRequest(res, instances, version)
        if stale and version >= 0:
            with pytest.raises(StateConflict):
                self.store.reserve(request, fence=self.fence("p2", spare))
            return
        if stale:
            return
        self.store.reserve(request, fence=self.fence("p2", spare))
        self.versions[pool.id] += 1
        self.reserved[res.request_id] = res
        self._recorded([created(i, i.reason, code=i.reason) for i in instances])

    @precondition(lambda self: bool(self.reserved))
    @rule(which=st.integers(0, 50), count=st.integers(-1, 3))
    def settle(self, which: int, count: int) -> None:
        rid = sorted(self.reserved)[which % len(self.reserved)]
        self.store.settle_reservation(rid, count)
        if count <= 0:
            del self.reserved[rid]
        else:
            self.reserved[rid] = replace(self.reserved[rid], count=count)

    @rule()
    def sweep(self) -> None:
        now = self._tick()
        expired = {k for k, r in self.reserved.items() if r.expires_at <= now}
        assert self.store.sweep_reservations(now) == len(expired)
        for k in expired:
            del self.reserved[k]

    # ------------------------------------------------------------ outbox

    @rule(key=st.sampled_from(["a", "b", "c"]), pool=st.sampled_from(POOLS))
    def emit(self, key: str, pool: Pool) -> None:
        """An event id already in the outbox is skipped."""
        self.store.emit([_event(f"sample:{key}", pool, self.now)])
        if f"sample:{key}" not in self.outbox:
            self.outbox.append(f"sample:{key}")

    @rule(limit=st.integers(1, 5), fail=st.booleans())
    def relay(self, limit: int, fail: bool) -> None:
        """Oldest first; a hand-off that fails leaves every event for the next try."""
        got: list[str] = []

        def append(events: list[LifecycleEvent]) -> None:
            got.extend(e.event_id for e in events)
            if fail:
                raise RuntimeError("the log is away")

        if fail and self.outbox:
            with pytest.raises(RuntimeError):
                self.store.relay_outbox(append, limit)
            assert got == self.outbox[:limit]
            return
        assert self.store.relay_outbox(append, limit) == len(got)
        assert got == self.outbox[:limit]
        del self.outbox[:limit]

    # ------------------------------------------------------------ signals

    @rule(pool=st.sampled_from(POOLS), stale=st.booleans())
    def exclude(self, pool: Pool, stale: bool) -> None:
        held = self.exclusions.get(pool.id)
        version = held.version if held else 0
        at = self._tick()
        ex = Exclusion(pool.id, ExclusionState.EXCLUDED, at, at + 60, 60, at, "reclaims", version)
        event = _event(f"excluded:{pool.id}:{version}", pool, at)
        if stale and version > 0:
            with pytest.raises(StateConflict):
                self.store.put_exclusion(replace(ex, version=version - 1), event)
            return
        saved = self.store.put_exclusion(ex, event)
        assert saved == replace(ex, version=version + 1)
        self.exclusions[pool.id] = saved
        self.outbox.append(event.event_id)

    @rule(values=st.lists(st.floats(0, 1), max_size=2), keep=st.integers(1, 3))
    def score(self, values: list[float], keep: int) -> None:
        """A save is the generation after the newest one kept, and keeps `keep` of them
        (an empty save makes a generation of nothing)."""
        scores = [_score(POOLS[k], self.now, v) for k, v in enumerate(values)]
        generation = max(self.scores, default=0) + 1
        assert self.store.save_scores(scores, keep=keep) == generation
        if scores:
            self.scores[generation] = {s.pool: s.value for s in scores}
        for g in [g for g in self.scores if g <= generation - keep]:
            del self.scores[g]
        latest = self.store.latest_scores()
        newest = max(self.scores, default=None)
        kept = self.scores[newest] if newest is not None else {}
        assert {p: s.value for p, s in latest.items()} == kept
        assert {s.generation for s in latest.values()} <= {newest}

    @rule(partition=st.sampled_from(PARTITIONS), again=st.booleans(), spare=st.integers(0, 9))
    def plan(self, partition: str, again: bool, spare: int) -> None:
        generation = self.plans.get(partition, 0) + (0 if again else 1)
        plan = Plan(partition, generation, self.now, {POOLS[0].id: 2}, {}, ("n",))
        if again and generation > 0:
            with pytest.raises(StateConflict):
                self.store.save_plan(plan, fence=self.fence(partition, spare))
            return
        if again:
            return
        self.store.save_plan(plan, fence=self.fence(partition, spare))
        self.plans[partition] = generation
        latest = self.store.latest_plan(partition)
        assert latest is not None
        assert (latest.generation, dict(latest.spot)) == (generation, {POOLS[0].id: 2})

    @rule(pool=st.sampled_from(POOLS), up=st.booleans())
    def pool_age(self, pool: Pool, up: bool) -> None:
        """The first time a pool has capacity stands until it has none."""
        at = self._tick() if up else None
        changes = (self.ages[pool.id] is None) != (at is None)
        assert self.store.set_pool_age(pool.id, at) is changes
        if changes:
            self.ages[pool.id] = at

    @rule(partition=st.sampled_from(PARTITIONS), intent=st.sampled_from(["drain", "pause", ""]))
    def intent(self, partition: str, intent: str) -> None:
        if intent:
            self.store.put_intent(partition, intent, self.now, "op")
            self.intents[partition] = intent
        else:
            assert self.store.drop_intent(partition) is (partition in self.intents)
            self.intents.pop(partition, None)

    # ------------------------------------------------------------ fencing

    @rule(partition=st.sampled_from(LEASED), holder=st.sampled_from(HOLDERS))
    def take_lease(self, partition: str, holder: str) -> None:
        """A lease kept in fleet state's own table, taken by a new holder (every earlier
        lease has expired): its token is larger than any the partition had, and
        claiming it gives that token back."""
        self.lease_now += 2 * TTL_S
        lease = self.leases.acquire(partition, holder, TTL_S, self.lease_now)
        assert lease is not None
        assert lease.token > self.fence(partition)
        claimed = self.leases.claim_fence(
            partition, holder, lease.token, lease.expires_at, self.lease_now
        )
        assert claimed == lease.token
        self.fences[partition] = (holder, lease.token)
        self.live_until[partition] = lease.expires_at

    @rule(
        partition=st.sampled_from(LEASED),
        holder=st.sampled_from(HOLDERS),
        token=st.integers(1, 9),
    )
    def claim(self, partition: str, holder: str, token: int) -> None:
        """A lease kept elsewhere (Kubernetes) was taken with `token`, every earlier
        lease and claim having lapsed: the holder writes with that token when fleet
        state has seen none as large; with its own claim again when it claims no
        larger; else one past the largest fleet state has seen (a Lease that counts
        from 1 again writes above every older holder)."""
        self.lease_now += 2 * TTL_S
        held = self.fences.get(partition)
        if held is None:
            expected = token
        elif held[0] == holder and held[1] >= token:
            expected = held[1]
        else:
            expected = max(token, held[1] + 1)
        until = self.lease_now + TTL_S
        assert self.leases.claim_fence(partition, holder, token, until, self.lease_now) == expected
        self.fences[partition] = (holder, expected)
        self.live_until[partition] = until

    @precondition(lambda self: bool(self.fences))
    @rule(
        partition=st.sampled_from(LEASED),
        other=st.sampled_from(HOLDERS),
        token=st.integers(1, 99),
        kind=st.sampled_from(["claim", "lease"]),
    )
    def held_claim_is_not_taken(self, partition: str, other: str, token: int, kind: str) -> None:
        """While the last claim or lease is live, another holder neither claims the
        partition (a replica of the other lease kind, in a rolling change of kind) nor
        takes its lease: they must not fence each other in turn. Its holder claims it
        again, at its own token."""
        held = self.fences.get(partition)
        if held is None or other == held[0] or self.live_until[partition] < self.lease_now:
            return
        if kind == "claim":
            got = self.leases.claim_fence(
                partition, other, token, self.lease_now + 1, self.lease_now
            )
            assert got is None
        else:
            assert self.leases.acquire(partition, other, TTL_S, self.lease_now) is None
        again = self.leases.claim_fence(partition, held[0], 1, self.lease_now + 1, self.lease_now)
        assert again == held[1]

    @precondition(lambda self: bool(self.fences))
    @rule(
        partition=st.sampled_from(LEASED),
        below=st.integers(1, 9),
        what=st.sampled_from(["create", "move", "reserve", "plan"]),
        which=st.integers(0, 10**6),
        pick=st.integers(0, 20),
    )
    def stale_token_is_fenced_out(
        self, partition: str, below: int, what: str, which: int, pick: int
    ) -> None:
        """A write carrying a token below the partition's is refused (an older holder,
        paused past its lease): FencedOut, and nothing of it lands."""
        if partition not in self.fences:
            return
        fence = max(0, self.fence(partition) - below)
        pool = POOLS[which % len(POOLS)]
        at = self._tick()
        write: Callable[[], None]
        if what == "create":
            change = created(_new(pool, partition, at), "stale")
            write = partial(self.store.record, [change], fence=fence)
        elif what == "move":
            changes = self._moves(partition, which, pick, 2)
            if not changes:
                return
            write = partial(self.store.record, changes, fence=fence)
        elif what == "reserve":
            new = _new(pool, partition, at)
            res = Reservation(new.request_id, pool.id, partition, 1, at, at + 50.0)
            request = NewRequest(res, (new,), self.versions[pool.id])
            write = partial(self.store.reserve, request, fence=fence)
        else:
            generation = self.plans.get(partition, 0) + 1
            plan = Plan(partition, generation, at, {pool.id: 1}, {})
            write = partial(self.store.save_plan, plan, fence=fence)
        with pytest.raises(FencedOut):
            write()

    # ------------------------------------------------------------ what must hold

    @invariant()
    def records_agree(self) -> None:
        for partition in PARTITIONS:
            live = {i.id: i for i in self.store.instances(partition)}
            assert live == {
                k: i
                for k, i in self.model.items()
                if i.partition == partition and i.state is not State.GONE
            }
        counts = self.store.counts()
        assert counts.history_rows == len(self.history)
        by_state: dict[str, int] = {}
        for i in self.model.values():
            by_state[i.state.value] = by_state.get(i.state.value, 0) + 1
        assert dict(counts.instances_by_state) == by_state
        assert counts.reservations == len(self.reserved)
        assert counts.plans == sum(self.plans.values())
        live_pools: dict[str, int] = {}
        for i in self.model.values():
            if i.state in LIVE:
                live_pools[i.pool] = live_pools.get(i.pool, 0) + 1
        assert self.store.live_per_pool() == live_pools

    @invariant()
    def audit_agrees(self) -> None:
        """Every transition in the order written; every record, gone ones too, with its
        server; a server's record's state."""
        assert self.store.history() == self.history
        if self.history:
            first = self.history[0].instance_id
            assert self.store.history(first) == [h for h in self.history if h.instance_id == first]
        assert sorted(self.store.lives()) == sorted(
            (i.id, i.server_id, i.state.value) for i in self.model.values()
        )
        for i in self.model.values():
            if i.server_id is not None:
                assert self.store.state_of_server(i.server_id) == i.state.value
        assert self.store.state_of_server("srv-nobody") is None

    @invariant()
    def reclaims_agree(self) -> None:
        assert self.store.reclaims_since(0.0) == self.reclaims
        half = self.now - 30.0
        assert self.store.reclaims_since(half) == [r for r in self.reclaims if r[2] >= half]

    @invariant()
    def pools_agree(self) -> None:
        records = self.store.pool_records()
        for p in POOLS:
            reserved = sum(r.count for r in self.reserved.values() if r.pool == p.id)
            assert (records[p.id].version, records[p.id].reserved) == (
                self.versions[p.id],
                reserved,
            )
        assert sorted(r.request_id for r in self.store.reservations()) == sorted(self.reserved)
        assert self.store.pool_ages() == self.ages

    @invariant()
    def signals_agree(self) -> None:
        assert self.store.outbox_size() == len(self.outbox)
        assert self.store.exclusions() == self.exclusions
        assert self.store.intents() == self.intents
        stamp = self.store.signal_stamp()
        assert stamp[0] == sum(e.version for e in self.exclusions.values())

    def holds(self) -> None:
        """Every invariant, now (the scenarios below call the rules themselves)."""
        self.records_agree()
        self.audit_agrees()
        self.reclaims_agree()
        self.pools_agree()
        self.signals_agree()


def _machine(make: Factory) -> type[FleetStateRules]:
    class Machine(FleetStateRules):
        pass

    Machine.make = staticmethod(make)
    return Machine


def test_fleet_state_keeps_the_ports_promises(impl: Implementation) -> None:
    machine = _machine(impl.open)
    machine.TestCase.settings = settings(
        max_examples=impl.examples, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )  # fmt: skip
    machine.TestCase().runTest()


# ---------------------------------------------------------------- fencing, rule by rule


@pytest.fixture
def fleet(impl: Implementation) -> Iterator[FleetStateRules]:
    """The machine above, driven by hand: each step checked against the model."""
    machine = _machine(impl.open)()
    yield machine
    machine.teardown()


def _to_gone(state: State) -> list[Trigger]:
    """The triggers of a shortest path from `state` to GONE."""
    paths: deque[tuple[State, list[Trigger]]] = deque([(state, [])])
    seen = {state}
    while paths:
        at, path = paths.popleft()
        if at is State.GONE:
            return path
        for (s, t), to in EDGES.items():
            if s is at and to not in seen:
                seen.add(to)
                paths.append((to, [*path, t]))
    raise AssertionError(f"no way from {state} to gone")


def test_a_first_claim_is_its_token_and_a_holders_own_claim_stands(
    fleet: FleetStateRules,
) -> None:
    fleet.claim("p1", "r1", 3)
    assert fleet.fence("p1") == 3, "fleet state saw none as large"
    fleet.claim("p1", "r1", 3)
    fleet.claim("p1", "r1", 2)
    assert fleet.fence("p1") == 3, "its own claim, kept"
    fleet.create(POOLS[0], "p1", 0)
    fleet.holds()


def test_a_lease_that_counts_from_one_again_writes_above_every_older_holder(
    fleet: FleetStateRules,
) -> None:
    """Defect 4 of issue 25: a new Kubernetes Lease (recreated, or leases moved from the
    database to Kubernetes) starts at token 1 while fleet state keeps the largest token
    it saw: every write was refused, and the partition stalled silently."""
    for token, holder in ((1, "r1"), (2, "r2"), (7, "r3")):  # the database counted to 7
        fleet.claim("p1", holder, token)
    fleet.claim("p1", "r1", 1)
    assert fleet.fence("p1") == 8, "one past the largest seen"
    fleet.create(POOLS[0], "p1", 0)
    fleet.claim("p1", "r1", 1)
    assert fleet.fence("p1") == 8, "its own claim, kept"
    fleet.claim("p1", "r2", 1)  # the Lease recreated again: another holder at 1
    assert fleet.fence("p1") == 9
    fleet.stale_token_is_fenced_out("p1", below=1, what="create", which=0, pick=0)  # r1's 8
    fleet.holds()


def test_a_write_with_a_stale_token_is_refused_and_leaves_nothing(
    fleet: FleetStateRules,
) -> None:
    fleet.take_lease("p2", "old")
    fleet.create(POOLS[0], "p2", 0)
    fleet.reserve(POOLS[1], 2, stale=False, spare=0)
    fleet.plan("p2", again=False, spare=0)
    fleet.take_lease("p2", "new")  # the old holder paused past its lease: taken over
    for what in ("create", "move", "reserve", "plan"):
        fleet.stale_token_is_fenced_out("p2", below=1, what=what, which=0, pick=0)
        fleet.holds()
    fleet.move("p2", which=0, pick=0, batch=2, spare=0)  # the new holder writes on
    fleet.plan("p2", again=False, spare=0)
    fleet.holds()


def test_a_partition_without_a_lease_is_not_fenced(fleet: FleetStateRules) -> None:
    fleet.take_lease("p1", "r1")
    fleet.claim("p2", "r1", 5)
    for spare in (0, 9, 3):  # any token, larger or smaller than other partitions'
        fleet.create(POOLS[0], UNLEASED, spare)
        fleet.move(UNLEASED, which=0, pick=0, batch=1, spare=spare)
        fleet.plan(UNLEASED, again=False, spare=spare)
    fleet.holds()


def test_the_audit_reads_every_record_gone_ones_too(fleet: FleetStateRules) -> None:
    fleet.create(POOLS[0], "p1", 0)
    fleet.create(POOLS[1], "p1", 0)
    [first, _] = sorted(fleet.model.values(), key=lambda i: int(i.id[1:]))
    for trigger in _to_gone(first.state):
        ch = step(fleet.model[first.id], trigger, fleet._tick(), "walked", server_id="srv-x")
        fleet.store.record([ch])
        fleet._recorded([ch])
    assert fleet.model[first.id].state is State.GONE
    assert fleet.store.state_of_server("srv-x") == "gone"
    fleet.holds()


def test_settling_a_reservation_is_not_fenced(fleet: FleetStateRules) -> None:
    """`settle_reservation` takes no token, and dropping a reservation never was fenced:
    shrinking one is not either, whatever token it was made with. SQL refused the
    shrink of a reservation made before the partition's lease (its row kept the
    token it was made with, which the fencing trigger compared), with a bare
    IntegrityError; the twin let it through (found by this suite)."""
    fleet.reserve(POOLS[0], 3, stale=False, spare=0)
    fleet.take_lease("p2", "r1")
    fleet.settle(which=0, count=2)
    fleet.holds()
    fleet.take_lease("p2", "r2")
    fleet.settle(which=0, count=1)
    fleet.settle(which=0, count=0)
    fleet.holds()


def test_a_pool_reads_back_as_written_its_notice_and_cold_start_too(
    fleet: FleetStateRules,
) -> None:
    """A controller reads a pool from fleet state when discovery no longer lists it.
    SQL dropped its notice and cold start (a pool with notice read as one without),
    the twin kept them (found by the swarm: a seed ran differently on the two)."""
    told = replace(POOLS[0], notice_s=120.0, cold_start_s=70.0)
    fleet.store.upsert_pools([told])
    assert {p.id: p for p in fleet.store.pools()}[told.id] == told
    changed = replace(told, notice_s=0.0, cold_start_s=None, price_per_h=2.5)
    fleet.store.upsert_pools([changed])
    assert {p.id: p for p in fleet.store.pools()}[told.id] == changed
    fleet.holds()


def test_a_request_whose_ids_are_taken_is_refused_whole(fleet: FleetStateRules) -> None:
    """An id source that repeats (the swarm's `ids_repeat`) names a reservation or a
    record that exists: the request is a conflict and writes nothing, its pool's
    version and reservations as they were."""
    fleet.reserve(POOLS[0], 1, stale=False, spare=0)
    (held,) = fleet.reserved.values()
    at = fleet._tick()
    again = replace(_new(POOLS[0], "p2", at), request_id=held.request_id)
    taken = replace(_new(POOLS[0], "p2", at), id=next(iter(fleet.model)))
    for inst in (again, taken):
        res = Reservation(inst.request_id, POOLS[0].id, "p2", 1, at, at + 50.0)
        request = NewRequest(res, (inst,), fleet.versions[POOLS[0].id])
        with pytest.raises(StateConflict):
            fleet.store.reserve(request, fence=fleet.fence("p2"))
    fleet.holds()
