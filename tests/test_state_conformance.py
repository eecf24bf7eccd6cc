"""One conformance suite for fleet state and the event log: the SQL adapters (SQLite
and PostgreSQL) and the lab's in-memory twins are held to the same semantics here.

The rules live in this file, once: a small model of what the port promises
(records and their versions, pools and their reservations, the outbox, exclusions,
scores, plans, pool ages, intents) that hypothesis drives with random operations,
stale writes among them, checking every implementation's answers against it after
each step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.events import LifecycleEvent, parse_event
from sco.domain.instances import Change, Instance, created, step
from sco.domain.lifecycle import EDGES, LIVE, State, Trigger
from sco.domain.plans import Plan
from sco.domain.pools import Pool
from sco.domain.signals import Exclusion, ExclusionState, PoolScore
from sco.lab.twins.eventlog import MemoryEventLog
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import EventLog, FleetStore, NewRequest, Reservation, StateConflict
from sco_harness.builders import spot_pool

POOLS = [spot_pool(hall="h1", zone="a"), spot_pool(hall="h2", zone="b")]
PARTITIONS = ["p1", "p2"]
_n = itertools.count(1)


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


# ---------------------------------------------------------------- implementations


Factory = Callable[[Path], tuple[FleetStore, Callable[[], None]]]


def _sqlite(tmp: Path) -> tuple[FleetStore, Callable[[], None]]:
    store = SqlFleetStore(sqlite_url(tmp / f"s{next(_n)}.db"), contracts=False)
    return store, store.close


def _memory(_tmp: Path) -> tuple[FleetStore, Callable[[], None]]:
    return MemoryFleetStore(), lambda: None


class FleetStoreRules(RuleBasedStateMachine):
    """The FleetStore port's semantics, as a model the store must agree with."""

    make: Factory
    tmp: Path

    def __init__(self) -> None:
        super().__init__()
        self.store, self.close = self.make(self.tmp)
        self.store.upsert_pools(POOLS)
        self.now = 1000.0
        self.model: dict[str, Instance] = {}  # every record as last written, gone ones too
        self.older: list[Instance] = []  # copies read before a later write: stale
        self.history = 0
        self.reclaims: list[tuple[str, str, float]] = []
        self.versions = {p.id: 0 for p in POOLS}
        self.reserved: dict[str, Reservation] = {}
        self.outbox: list[str] = []
        self.exclusions: dict[str, Exclusion] = {}
        self.scores: dict[int, dict[str, float]] = {}
        self.plans: dict[str, int] = {}
        self.ages: dict[str, float | None] = {p.id: None for p in POOLS}
        self.intents: dict[str, str] = {}

    def teardown(self) -> None:
        self.close()

    def _tick(self) -> float:
        self.now += 7.0
        return self.now

    def _recorded(self, changes: list[Change]) -> None:
        for ch in changes:
            if ch.before is not None:
                self.older.append(ch.before)
            self.model[ch.after.id] = ch.after
            self.history += 1
            self.outbox.append(f"{ch.after.id}:{ch.after.version}")
            if ch.trigger in (Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED):
                self.reclaims.append((ch.after.pool, ch.after.id, ch.at))

    # ------------------------------------------------------------ records

    @rule(pool=st.sampled_from(POOLS), partition=st.sampled_from(PARTITIONS))
    def create(self, pool: Pool, partition: str) -> None:
        ch = created(_new(pool, partition, self._tick()), "asked")
        self.store.record([ch])
        self._recorded([ch])

    @precondition(lambda self: bool(self.model))
    @rule(which=st.integers(0, 10**6), pick=st.integers(0, 20), batch=st.integers(1, 3))
    def move(self, which: int, pick: int, batch: int) -> None:
        """Changes from the version read move records along the table, several at once
        (and one record more than once in a batch)."""
        ids = sorted(self.model)
        changes: list[Change] = []
        latest: dict[str, Instance] = {}
        for k in range(batch):
            key = ids[(which + k // 2) % len(ids)]
            current = latest.get(key, self.model[key])
            moves = [t for (s, t) in EDGES if s is current.state]
            if not moves:
                continue
            ch = step(current, moves[(pick + k) % len(moves)], self._tick(), "observed")
            changes.append(ch)
            latest[key] = ch.after
        self.store.record(changes)
        self._recorded(changes)

    @precondition(lambda self: bool(self.older))
    @rule(which=st.integers(0, 10**6), pool=st.sampled_from(POOLS))
    def stale_write_is_refused_whole(self, which: int, pool: Pool) -> None:
        """A batch with one change from a version no longer held writes nothing, and a
        record is created once."""
        old = self.older[which % len(self.older)]
        moves = [t for (s, t) in EDGES if s is old.state]
        good = created(_new(pool, "p1", self._tick()), "would be new")
        if moves:
            bad = step(old, moves[0], self.now, "from a stale read")
            with pytest.raises(StateConflict):
                self.store.record([good, bad])
        with pytest.raises(StateConflict):
            self.store.record([created(self.model[old.id], "created twice")])

    # ------------------------------------------------------------ reservations

    @rule(pool=st.sampled_from(POOLS), count=st.integers(1, 3), stale=st.booleans())
    def reserve(self, pool: Pool, count: int, stale: bool) -> None:
        at = self._tick()
        instances = tuple(_new(pool, "p2", at) for _ in range(count))
        res = Reservation(instances[0].request_id, pool.id, "p2", count, at, at + 50.0)
        version = self.versions[pool.id] - (1 if stale else 0)
        request = NewRequest(res, instances, version)
        if stale and version >= 0:
            with pytest.raises(StateConflict):
                self.store.reserve(request)
            return
        if stale:
            return
        self.store.reserve(request)
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
        assert {p: s.value for p, s in latest.items()} == self.scores.get(newest, {})
        assert {s.generation for s in latest.values()} <= {newest}

    @rule(partition=st.sampled_from(PARTITIONS), again=st.booleans())
    def plan(self, partition: str, again: bool) -> None:
        generation = self.plans.get(partition, 0) + (0 if again else 1)
        plan = Plan(partition, generation, self.now, {POOLS[0].id: 2}, {}, ("n",))
        if again and generation > 0:
            with pytest.raises(StateConflict):
                self.store.save_plan(plan)
            return
        if again:
            return
        self.store.save_plan(plan)
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
        assert counts.history_rows == self.history == len(self.store.history())
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


def _suite(make: Factory, tmp: Path) -> None:
    class Machine(FleetStoreRules):
        pass

    Machine.make = staticmethod(make)  # type: ignore[assignment]
    Machine.tmp = tmp
    Machine.TestCase.settings = settings(
        max_examples=25, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )  # fmt: skip
    Machine.TestCase().runTest()


@pytest.mark.parametrize("make", [_memory, _sqlite], ids=["memory", "sqlite"])
def test_fleet_state_keeps_the_ports_promises(make: Factory, tmp_path: Path) -> None:
    _suite(make, tmp_path)


def test_fleet_state_on_postgresql_keeps_the_ports_promises(
    postgres: object, tmp_path: Path
) -> None:
    def _postgres(_tmp: Path) -> tuple[FleetStore, Callable[[], None]]:
        store = SqlFleetStore(postgres.new_database(), contracts=False)  # type: ignore[attr-defined]
        return store, store.close

    _suite(_postgres, tmp_path)


# ---------------------------------------------------------------- the event log


Relay = Callable[[list[LifecycleEvent]], int]


def _memory_log(_folder: Path) -> tuple[EventLog, Callable[[], EventLog], Relay]:
    store = MemoryFleetStore()
    log = MemoryEventLog(store)

    def relay(events: list[LifecycleEvent]) -> int:
        store.emit(events)
        return log.absorb_outbox()

    return log, log.restarted, relay


def _sql_log(folder: Path) -> tuple[EventLog, Callable[[], EventLog], Relay]:
    store = SqlFleetStore(sqlite_url(folder / "log.db"), contracts=False)
    log = SqlEventLog(store.engine)

    def relay(events: list[LifecycleEvent]) -> int:
        store.emit(events)
        return log.absorb_outbox()

    return log, lambda: SqlEventLog(store.engine), relay


@pytest.mark.parametrize("open_log", [_memory_log, _sql_log], ids=["memory", "sqlite"])
@given(
    batches=st.lists(
        st.lists(st.sampled_from([f"e{k}" for k in range(8)]), max_size=5), min_size=1, max_size=5
    ),
    limit=st.integers(1, 4),
)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_event_log_keeps_order_takes_ids_once_and_restarts_at_the_commit(
    open_log: Callable[[Path], tuple[EventLog, Callable[[], EventLog], Relay]],
    tmp_path: Path,
    batches: list[list[str]],
    limit: int,
) -> None:
    """Appended in order, each id once (a relay repeated after a crash adds nothing); a
    reader moves on as it reads, and a restarted one starts again at its commit."""
    folder = tmp_path / f"run{next(_n)}"
    folder.mkdir()
    log, restart, relay = open_log(folder)
    seen: list[str] = []
    for batch in batches:
        keys = list(dict.fromkeys(batch))
        new = [k for k in keys if k not in seen]
        assert relay([_event(k, POOLS[0], 1.0) for k in keys]) == len(new)
        seen.extend(new)
    read: list[str] = []
    while records := log.read("c", limit):
        if not read:
            log.commit("c", records[-1].offset)  # only the first batch is committed
        read.extend(parse_event(r.payload).event_id for r in records)
    assert read == seen
    again = restart()
    assert [parse_event(r.payload).event_id for r in again.read("c", 1000)] == seen[limit:]
