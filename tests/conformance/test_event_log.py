"""The event log's rules (`sco.ports.EventLog`), once, over every implementation:
`SqlEventLog` on SQLite and on PostgreSQL, `KafkaEventLog` on a real Kafka-protocol
broker (tansu, started by the session's `kafka_bootstrap` fixture), and the lab's
`MemoryEventLog`.

A restart is a new process's log: readers start at their consumer's commit. Kafka's
readers may read nothing while their consumer group forms, so reads are repeated
until what is owed has come (or `WAIT_S` has passed: a broken log). Kafka keeps order
per partition: the events here are one pool's, on a topic of one partition.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sco.adapters.kafka.eventlog import KafkaEventLog
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.domain.events import LifecycleEvent, parse_event
from sco.lab.twins.eventlog import MemoryEventLog
from sco.ports import EventLog, LogRecord
from sco_harness.kafka_broker import FAST_GROUPS, WAIT_S, headers, raw

POOL = "r1/hall-1/gpu/a"
_prefixes = itertools.count(1)


def ev(n: int) -> LifecycleEvent:
    return LifecycleEvent(f"e{n}", float(n), "p1", POOL, f"i{n}", "node_joined", "test")


@dataclass
class Implementation:
    open: Callable[[], EventLog]  # the log as a process (re)started finds it
    parked: Callable[[], list[tuple[str, str, str]]]  # (consumer, payload, error), in order
    dedupes: bool  # an event id appended again is not appended (the log can tell)
    forms: bool = False  # a new reader may read nothing for a while (a group forming)


def _sql(kind: str) -> Callable[[pytest.FixtureRequest], Iterator[Implementation]]:
    def make(request: pytest.FixtureRequest) -> Iterator[Implementation]:
        first = SqlEventLog.open(request.getfixturevalue("database_url")(kind))

        def parked() -> list[tuple[str, str, str]]:
            return [(c, p, e) for c, _, p, e in first.dead_letters()]

        yield Implementation(lambda: SqlEventLog(first.engine), parked, dedupes=True)
        first.close()

    return make


def _kafka(request: pytest.FixtureRequest) -> Iterator[Implementation]:
    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    prefix = f"sco.conformance{next(_prefixes)}."  # topics of this test's own
    logs: list[KafkaEventLog] = []

    def open_() -> KafkaEventLog:
        if logs:
            logs[-1].close()  # the process ends: it leaves its groups, uncommitted reads go
        log = KafkaEventLog(
            bootstrap,
            consumer_config=FAST_GROUPS,
            topic_prefix=prefix,
            regions=["r1"],
            new_topic_partitions=1,  # one partition: the log's order is the append order
        )
        logs.append(log)
        return log

    def parked() -> list[tuple[str, str, str]]:
        return [
            (headers(m)["consumer"], (m.value() or b"").decode(), headers(m)["error"])
            for m in raw(bootstrap, logs[-1].dead_letter_topic)
        ]

    yield Implementation(open_, parked, dedupes=False, forms=True)
    for log in logs:
        log.close()


def _memory(_request: pytest.FixtureRequest) -> Iterator[Implementation]:
    log = MemoryEventLog()

    def parked() -> list[tuple[str, str, str]]:
        return [(c, p, e) for c, _, p, e in log.dead_letters()]

    yield Implementation(log.restarted, parked, dedupes=True)


IMPLEMENTATIONS = {
    "sqlite": _sql("sqlite"),
    "postgresql": _sql("postgresql"),
    "kafka": _kafka,
    "memory": _memory,
}


@pytest.fixture(params=list(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> Iterator[Implementation]:
    yield from IMPLEMENTATIONS[request.param](request)


def read(impl: Implementation, log: EventLog, consumer: str, n: int) -> list[LogRecord]:
    """The next `n` records for `consumer`, in as many reads as it takes: never more."""
    got: list[LogRecord] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < n:
        batch = log.read(consumer, n - len(got))
        assert len(batch) <= n - len(got), f"{consumer}: read past the limit"
        got += batch
        if not batch:
            assert impl.forms, f"{consumer}: {len(got)} of {n} read, then none"
            assert time.monotonic() < deadline, f"{consumer}: {len(got)} of {n} read in time"
    return got


def ids(records: list[LogRecord]) -> list[str]:
    return [parse_event(r.payload).event_id for r in records]


# ---------------------------------------------------------------- the rules


def test_records_are_read_in_the_order_appended(impl: Implementation) -> None:
    log = impl.open()
    events = [ev(n) for n in range(1, 7)]
    log.append(events[:3])
    log.append(events[3:4])
    log.append(events[4:])
    log.append([])
    got = read(impl, log, "c", len(events))
    assert [r.payload for r in got] == [e.dumps() for e in events], "as appended, raw"
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets)), "offsets grow"


def test_an_id_appended_again_is_kept_once_where_the_log_can_tell(impl: Implementation) -> None:
    """A relay that died after appending and before clearing its outbox appends again.
    A log that can tell keeps each id once; Kafka cannot, and its readers see the
    event twice (consumers dedupe by event id, as the port allows)."""
    log = impl.open()
    log.append([ev(1), ev(2)])
    log.append([ev(2), ev(3)])  # the relay again, with one event more
    log.append([ev(4)])
    if impl.dedupes:
        assert ids(read(impl, log, "c", 4)) == ["e1", "e2", "e3", "e4"]
    else:
        assert ids(read(impl, log, "c", 5)) == ["e1", "e2", "e2", "e3", "e4"]


def test_a_reader_moves_on_as_it_reads(impl: Implementation) -> None:
    log = impl.open()
    log.append([ev(n) for n in range(1, 6)])
    assert ids(read(impl, log, "c", 2)) == ["e1", "e2"]
    assert ids(read(impl, log, "c", 2)) == ["e3", "e4"], "on, though nothing is committed"
    log.append([ev(6)])
    assert ids(read(impl, log, "c", 2)) == ["e5", "e6"]


def test_a_restarted_reader_starts_at_its_commit(impl: Implementation) -> None:
    """At least once: what was read and not committed is read again after a restart."""
    log = impl.open()
    log.append([ev(n) for n in range(1, 6)])
    got = read(impl, log, "c", 3)
    log.commit("c", got[1].offset)
    assert ids(read(impl, log, "c", 1)) == ["e4"], "on past the commit"
    again = impl.open()
    rest = read(impl, again, "c", 3)
    assert ids(rest) == ["e3", "e4", "e5"], "from the commit"
    again.commit("c", rest[-1].offset)
    again.append([ev(6)])
    third = impl.open()
    assert ids(read(impl, third, "c", 1)) == ["e6"], "committed to the end: only the new"


def test_each_consumer_has_its_own_commit(impl: Implementation) -> None:
    log = impl.open()
    log.append([ev(n) for n in range(1, 5)])
    done = read(impl, log, "done", 4)
    half = read(impl, log, "half", 4)
    log.commit("done", done[-1].offset)
    log.commit("half", half[1].offset)
    again = impl.open()
    again.append([ev(5)])  # a marker: a reader at its commit reads it next
    assert ids(read(impl, again, "done", 1)) == ["e5"]
    assert ids(read(impl, again, "half", 3)) == ["e3", "e4", "e5"]
    assert ids(read(impl, again, "new", 5)) == ["e1", "e2", "e3", "e4", "e5"], "from the start"


def test_a_dead_letter_is_parked_with_its_consumer_and_error(impl: Implementation) -> None:
    """Parked where the consumer's readers do not read it again: the log goes on."""
    log = impl.open()
    log.append([ev(1), ev(2), ev(3)])
    got = read(impl, log, "c", 3)
    log.dead_letter("c", got[1], "not what c reads")
    log.commit("c", got[-1].offset)
    assert impl.parked() == [("c", ev(2).dumps(), "not what c reads")]
    log.append([ev(4)])
    assert ids(read(impl, log, "c", 1)) == ["e4"]
    again = impl.open()
    assert ids(read(impl, again, "other", 4)) == ["e1", "e2", "e3", "e4"], "nothing parked in it"
