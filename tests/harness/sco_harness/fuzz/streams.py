"""Events read from the stream: what a broken producer, a foreign writer or a newer
sco could put on the topic, and what the consumers do with it.

Each case is a batch of records (most often valid events with a few things
changed, some noise) appended to an embedded event log; then the exclusion
watcher and the history loader (on chDB, as `sco watch` and `sco history load`
run) each consume the batch. The rules:

- `parse_event` reads a record or raises `MalformedEvent`; what it accepts keeps
  the schema's promises (strings where strings are due, a finite `at`, a finite
  `value` or none);
- a consumer never stops on a record: each one it cannot read is parked in the
  dead letters with why, the rest are counted or loaded, and its position moves
  past the whole batch. A consumer that raises would read the same batch again
  and again (a poison pill): that is a crash;
- whatever a consumer accepted, pool history still answers the scorer's query.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st
from sqlalchemy import text

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.events import SCHEMA_VERSION, LifecycleEvent, MalformedEvent, parse_event
from sco.engine.signals_jobs import HistoryLoader
from sco.engine.watcher import ExclusionWatcher
from sco_harness.builders import guaranteed_pool, spot_pool
from sco_harness.fuzz import Check, Judge, Target
from sco_harness.fuzz.values import JUNK, documents, mutated

POOLS = [spot_pool(zone="a"), spot_pool(zone="b"), guaranteed_pool()]


def _event(kind: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event_id": "i-1:3",
        "at": 1_700_000_000.25,
        "partition": "batch",
        "pool": str(POOLS[0].id),
        "instance": "i-1",
        "kind": kind,
        "reason": "server vanished from the listing",
        "from_state": "READY",
        "to_state": "GONE",
        "value": None,
    }
    return doc | over


EVENTS: list[dict[str, Any]] = [
    _event("server_vanished"),
    _event("reclaim_notice", to_state="NOTICED", pool=str(POOLS[1].id)),
    _event("create_failed", from_state="REQUESTED", to_state="FAILED", instance="i-2"),
    _event("create_accepted", from_state="REQUESTED", to_state="CREATING"),
    _event("headroom", instance=None, from_state=None, to_state=None, value=3.0),
    _event("excluded", instance=None, from_state=None, to_state=None, pool=str(POOLS[2].id)),
    {k: v for k, v in _event("recorded").items() if k not in ("value", "from_state")},
]
EVENT_WORDS = sorted({k for e in EVENTS for k in e})


@st.composite
def _payload(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["event"] * 8 + ["document", "bytes", "spoilt"]))
    if how == "document":
        doc = draw(documents(EVENT_WORDS, surrogates=True))
    else:
        doc = draw(mutated(st.sampled_from(EVENTS), EVENT_WORDS, most=3, surrogates=True))
    if how == "bytes":
        return draw(st.binary(max_size=120))
    try:
        data = orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an int past 64 bits
        import json

        try:
            data = json.dumps(doc).encode()
        except (ValueError, RecursionError):
            data = b"{}"
    if how == "spoilt":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from(JUNK)) + data[at:]
    return data


def batches() -> st.SearchStrategy[list[bytes]]:
    return st.lists(_payload(), min_size=1, max_size=6)


def _promised(e: LifecycleEvent) -> bool:
    strings = (e.event_id, e.partition, e.pool, e.kind, e.reason)
    optional = (e.instance, e.from_state, e.to_state)
    return (
        all(type(s) is str for s in strings)
        and all(s is None or type(s) is str for s in optional)
        and type(e.at) is float
        and math.isfinite(e.at)
        and (e.value is None or (type(e.value) is float and math.isfinite(e.value)))
    )


LOAD_EVERY = 25  # cases between two loads into chDB (a load takes ~0.1 s)
QUERY_EVERY = 100  # cases between two scorer queries on the history


def events_target() -> Target:
    @contextmanager
    def world(folder: Path) -> Iterator[Check]:
        from sco.adapters.clickhouse.history import ClickHouseHistory

        store = SqlFleetStore(sqlite_url(folder / "state.sqlite"))
        store.upsert_pools(POOLS)
        events = SqlEventLog(store.engine)
        # Held open, as `sco history load` holds it: chDB keeps memory and threads at
        # every opening (the run died at 5,000 cases, 859 threads, none left to start).
        history = ClickHouseHistory(f"chdb://{folder / 'history'}", hold=True)
        watcher = ExclusionWatcher(events, store, POOLS)
        loader = HistoryLoader(events, history)
        serial = cases = parked_so_far = 0
        unloaded: list[str] = []  # what the loader has yet to read, for a finding

        def last_offset() -> int:
            with store.engine.connect() as c:
                return int(c.execute(text('SELECT max("offset") FROM event_log')).scalar() or 0)

        def consume(consumer: ExclusionWatcher | HistoryLoader, judge: Judge) -> None:
            judge.must(consumer.poll)
            # Committed past every record: it never reads this batch again.
            done = judge.must(lambda: events.committed(consumer.consumer) == last_offset())
            judge.expect(bool(done), f"{consumer.consumer} committed past every record")

        try:

            def check(case: list[bytes], judge: Judge) -> None:
                nonlocal serial, cases, parked_so_far
                cases += 1
                rows: list[tuple[str, str, str]] = []
                for payload in case:
                    serial += 1
                    text = payload.decode("utf-8", "replace")
                    rows.append((f"fuzz-{serial}", str(POOLS[0].id), text))
                    event = judge.call(functools.partial(parse_event, text), (MalformedEvent,))
                    if event is not None:
                        judge.expect(_promised(event), "an accepted event keeps the schema")
                judge.must(lambda: events.append_raw(rows))
                unloaded.extend(text for _, _, text in rows)
                dead_before = len(events.dead_letters())
                consume(watcher, judge)
                if cases % LOAD_EVERY == 0:
                    judge.case = unloaded[:]  # a loader's finding is about all of these
                    consume(loader, judge)
                    unloaded.clear()
                if cases % QUERY_EVERY == 0:
                    judge.must(lambda: history.pool_stats(1_700_000_000.0, 7 * 86400.0))
                # Each record a consumer parked is in the dead letters, with why.
                parked = watcher.parked + loader.parked
                dead = len(events.dead_letters()) - dead_before
                judge.expect(dead == parked - parked_so_far, "every parked record dead-lettered")
                parked_so_far = parked

            yield check
        finally:
            history.close()
            store.close()

    return Target("events", batches(), world, weight=1.0)
