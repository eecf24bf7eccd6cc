"""Lifecycle events: schema, outbox, relay, exclusion watcher. The event log's own rules
are in tests/conformance/test_event_log.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.exclusion import ExclusionConfig, on_crossing, state_for
from sco.domain.events import LifecycleEvent, MalformedEvent, event_of, parse_event
from sco.domain.instances import created, step
from sco.domain.lifecycle import State, Trigger
from sco.domain.pools import Pool
from sco.domain.signals import Exclusion, ExclusionState
from sco.engine.outbox import relay
from sco.engine.watcher import ExclusionWatcher
from sco.ports import LogRecord
from sco_harness.builders import instance, spot_pool

POOLS = [spot_pool(f"hall-{i % 3 + 1}", f"z{i}") for i in range(4)]


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlFleetStore]:
    """On SQLite and on PostgreSQL."""
    s = SqlFleetStore(fleet_url)
    s.upsert_pools(POOLS)
    yield s
    s.close()


def ev(n: int, pool: Pool, kind: str, at: float, inst: str | None = None) -> LifecycleEvent:
    return LifecycleEvent(f"e{n}", at, "p1", pool.id, inst or f"i{n}", kind, "test")


# ---------------------------------------------------------------- schema


def test_round_trip() -> None:
    e = LifecycleEvent("e1", 5.5, "p", "r/h/f", None, "headroom", "why", value=3.0)
    assert parse_event(e.dumps()) == e


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ("{nope", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"schema_version": 9}', "unknown schema_version 9"),
        (
            LifecycleEvent("e", 1.0, "p", "x", None, "k", "r")
            .dumps()
            .replace('"pool":"x"', '"pool":7'),
            "pool must be a string",
        ),
        (
            LifecycleEvent("e", 1.0, "p", "x", None, "k", "r")
            .dumps()
            .replace('"at":1.0', '"at":"soon"'),
            "at must be a finite number",
        ),
    ],
)
def test_malformed_events_say_what_is_wrong(payload: str, problem: str) -> None:
    with pytest.raises(MalformedEvent, match=problem):
        parse_event(payload)


def test_event_id_is_record_and_version() -> None:
    inst = instance(POOLS[0], State.ACTIVE)
    ch = step(inst, Trigger.NODE_JOINED, 1.0, "joined")
    e = event_of(ch)
    assert e.event_id == f"{inst.id}:{inst.version + 1}"
    assert (e.kind, e.from_state, e.to_state) == ("node_joined", "active", "ready")


# ---------------------------------------------------------------- outbox and relay


class CrashAfterAppend:
    """A log that appends, then dies before the relay can clear its outbox."""

    def __init__(self, log: SqlEventLog) -> None:
        self.log = log

    def append(self, events: Sequence[LifecycleEvent]) -> None:
        self.log.append(events)
        raise RuntimeError("relay killed after append")

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        return self.log.read(consumer, limit)

    def commit(self, consumer: str, offset: int) -> None:
        self.log.commit(consumer, offset)

    def dead_letter(self, consumer: str, record: LogRecord, error: str) -> None:
        self.log.dead_letter(consumer, record, error)


def test_every_change_is_an_event_none_lost_none_doubled_across_a_crash(
    store: SqlFleetStore,
) -> None:
    log = SqlEventLog(store.engine)
    inst = instance(POOLS[0], State.REQUESTED, server=False)
    first = created(inst, "new")
    second = step(inst, Trigger.CREATE_ACCEPTED, 1.0, "ok", server_id="s1")
    store.record([first])
    store.record([second])
    assert len(store.outbox_batch(100)) == 2
    with pytest.raises(RuntimeError):
        relay(store, CrashAfterAppend(log))
    assert len(store.outbox_batch(100)) == 2  # not cleared: will be relayed again
    assert relay(store, log) == 2
    assert store.outbox_batch(100) == []
    ids = [parse_event(r.payload).event_id for r in log.read("c", 100)]
    assert ids == [event_of(first).event_id, event_of(second).event_id]


def test_failed_state_write_writes_no_event(store: SqlFleetStore) -> None:
    from sco.ports import StateConflict

    inst = instance(POOLS[0], State.ACTIVE)
    store.record([created(inst, "new")])
    stale = step(inst, Trigger.NODE_JOINED, 1.0, "x")
    store.record([stale])
    with pytest.raises(StateConflict):
        store.record([stale])
    assert len(store.outbox_batch(100)) == 2


def test_a_log_of_its_own_relays_another_databases_outbox(
    store: SqlFleetStore, tmp_path: Path
) -> None:
    log = SqlEventLog.open(sqlite_url(tmp_path / "events.db"))
    inst = instance(POOLS[0], State.REQUESTED, server=False)
    store.record([created(inst, "new")])
    store.emit([ev(7, POOLS[1], "headroom", 1.0)])
    assert log.absorb_outbox(store.engine) == 2
    assert store.outbox_batch(10) == []
    store.emit([ev(7, POOLS[1], "headroom", 1.0)])  # relayed twice: in the log once
    log.absorb_outbox(store.engine)
    ids = [parse_event(r.payload).event_id for r in log.read("c", 10)]
    assert ids == [event_of(created(inst, "new")).event_id, "e7"]
    assert SqlEventLog(store.engine).read("c", 10) == []  # the state database has none
    log.close()


# ---------------------------------------------------------------- watcher


def watcher(store: SqlFleetStore, log: SqlEventLog, **cfg: float) -> ExclusionWatcher:
    config = ExclusionConfig(window_s=600, max_reclaims=3, base_cooldown_s=300, **cfg)  # type: ignore[arg-type]
    return ExclusionWatcher(log, store, POOLS, config)


def test_reclaims_exclude_a_pool_and_say_so(
    store: SqlFleetStore, caplog: pytest.LogCaptureFixture
) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log)
    log.append([ev(n, POOLS[0], "server_vanished", 100.0 + n) for n in range(2)])
    assert w.poll().changed == ()
    log.append([ev(2, POOLS[0], "reclaim_notice", 103.0)])
    with caplog.at_level(logging.INFO, logger="sco.engine.watcher"):
        changed = w.poll().changed
    assert [(c.pool, c.state, c.until) for c in changed] == [
        (POOLS[0].id, ExclusionState.EXCLUDED, 403.0)
    ]
    # Said once, with the time as people read it (issue 28: `sco watch` printed
    # "degraded until 1796202128", twice).
    said = [r.getMessage() for r in caplog.records if "until" in r.getMessage()]
    assert said == [f"pool {POOLS[0].id} excluded until 1970-01-01T00:06:43Z: "
                    "3 reclaims in 600s"]  # fmt: skip
    assert store.exclusions()[POOLS[0].id].state is ExclusionState.EXCLUDED
    kinds = [e.kind for _, e in store.outbox_batch(10)]
    assert kinds == ["excluded"]


def test_reclaims_outside_the_window_do_not_count(store: SqlFleetStore) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log)
    log.append([ev(n, POOLS[0], "server_vanished", n * 400.0) for n in range(5)])
    assert w.poll().changed == ()


def test_notice_then_vanish_is_one_reclaim_and_duplicates_count_once(
    store: SqlFleetStore,
) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log)
    for n in range(2):
        w.observe(ev(n, POOLS[1], "reclaim_notice", 10.0 + n, inst=f"i{n}"))
        w.observe(ev(100 + n, POOLS[1], "server_vanished", 20.0 + n, inst=f"i{n}"))
        w.observe(ev(n, POOLS[1], "reclaim_notice", 10.0 + n, inst=f"i{n}"))
    assert store.exclusions() == {}


def test_refused_creates_exclude_by_count_and_ratio(store: SqlFleetStore) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log, max_failures=10, max_failure_ratio=0.5, min_attempts=4)
    events = [
        ev(0, POOLS[2], "create_accepted", 1.0),
        ev(1, POOLS[2], "create_failed", 2.0),
        ev(2, POOLS[2], "create_accepted", 3.0),
        ev(3, POOLS[2], "create_failed", 4.0),
    ]
    log.append(events)
    assert [c.pool for c in w.poll().changed] == [POOLS[2].id]


def test_last_two_candidates_are_degraded_not_excluded(store: SqlFleetStore) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log)
    n = 0
    for pool in POOLS:
        log.append([ev(n + k, pool, "server_vanished", 100.0 + k) for k in range(3)])
        n += 3
    w.poll()
    states = [store.exclusions()[p.id].state for p in POOLS]
    assert states.count(ExclusionState.EXCLUDED) == 2
    assert states.count(ExclusionState.DEGRADED) == 2


def test_malformed_records_are_parked_not_fatal(store: SqlFleetStore) -> None:
    log = SqlEventLog(store.engine)
    w = watcher(store, log)
    log.append_raw([("bad1", "x", "{oops"), ("bad2", "x", '{"schema_version": 2}')])
    log.append([ev(5, POOLS[0], "node_joined", 1.0)])
    result = w.poll()
    assert (result.read, result.parked) == (3, 2)
    parked = log.dead_letters()
    assert [(c, o) for c, o, _, _ in parked] == [("exclusion-watcher", 1), ("exclusion-watcher", 2)]
    assert "unknown schema_version 2" in parked[1][3]
    assert log.read("exclusion-watcher", 10) == []  # committed past them


# ---------------------------------------------------------------- properties

CFG = ExclusionConfig(base_cooldown_s=100, max_cooldown_s=1600, quiet_reset_s=5000)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1, 400), min_size=1, max_size=30))
def test_cooldown_never_shrinks_while_failing(gaps: list[float]) -> None:
    ex: Exclusion | None = None
    now = 0.0
    cooldowns = []
    for gap in gaps:  # crossings closer together than the quiet period
        now += gap
        ex = on_crossing("p", ex, ExclusionState.EXCLUDED, "x", now, CFG)
        cooldowns.append(ex.cooldown_s)
        assert CFG.base_cooldown_s <= ex.cooldown_s <= CFG.max_cooldown_s
    assert cooldowns == sorted(cooldowns)


def test_cooldown_doubles_only_once_backed_off_and_resets_after_quiet() -> None:
    ex = on_crossing("p", None, ExclusionState.EXCLUDED, "x", 0.0, CFG)
    assert ex.cooldown_s == 100
    again = on_crossing("p", ex, ExclusionState.EXCLUDED, "x", 50.0, CFG)
    assert again.cooldown_s == 100  # still backed off: no doubling
    assert again.last_crossing == 50.0
    later = on_crossing("p", again, ExclusionState.EXCLUDED, "x", 150.0, CFG)
    assert later.cooldown_s == 200
    quiet = on_crossing("p", later, ExclusionState.EXCLUDED, "x", 150.0 + 5000, CFG)
    assert quiet.cooldown_s == 100


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 10_000)), max_size=40), st.integers(2, 6))
def test_exclusion_never_strands_a_flavor_class(crossings: list[tuple[int, float]], n: int) -> None:
    pools = [f"p{i}" for i in range(n)]
    current: dict[str, Exclusion] = {}
    for idx, at in sorted(crossings, key=lambda c: c[1]):
        pool = pools[idx % n]
        state = state_for(pool, pools, current, at, CFG)
        current[pool] = on_crossing(pool, current.get(pool), state, "x", at, CFG)
        excluded = [
            p for p, e in current.items() if e.state is ExclusionState.EXCLUDED and e.active(at)
        ]
        assert n - len(excluded) >= min(CFG.min_candidates, n)


def test_watcher_counts_events_of_pools_it_learns_of_later(store: SqlFleetStore) -> None:
    """Regression: a watcher started before the controllers wrote the region's pools
    skipped (and committed) their reclaims, so the pool was never excluded."""
    log = SqlEventLog(store.engine)
    watcher = ExclusionWatcher(log, store, [], reload_pools=store.pools)
    pool = POOLS[0]
    log.append([ev(n, pool, "server_vanished", 100.0 + n) for n in range(3)])
    result = watcher.poll()
    assert [ex.pool for ex in result.changed] == [pool.id]
