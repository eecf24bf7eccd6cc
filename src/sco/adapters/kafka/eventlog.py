"""The event log on Kafka: a topic per region, keyed by pool, through confluent-kafka.

Layout. A region's events go to the topic `<prefix><region>` (`sco.events.eu-west-1`),
the region being the pool id's first segment with every character Kafka does not allow
in a topic name replaced by `_` (so `eu west` and `eu_west` share a topic). The key is
the pool id, so one pool's events stay in one partition, in order; the value is the
event's JSON; the header `event_id` carries the event id. Records a consumer cannot read
are parked, raw, in `<prefix>dead-letters`, with headers naming the consumer, the error
and the topic, partition and offset they came from.

Appending. The producer is idempotent with acks=all: the client's own retries neither
duplicate nor reorder. `append` returns once the broker acknowledged every record, or
raises EventLogUnavailable (try again later; some of the records may be in the log) or
EventLogRejected (the broker refuses them: retrying will not help). Kafka cannot tell
that an event id is already in the log, so an event appended twice (a relay that died
between appending and clearing its outbox) is read twice; consumers dedupe by event id,
as the port allows.

Reading. Each consumer name is a Kafka consumer group (classic protocol), subscribed to
the topics of the configured regions or, with none configured, to every topic matching
`^<prefix>` but the dead-letter topic (a region topic created later is picked up at the
client's next metadata refresh, `topic.metadata.refresh.interval.ms`, 5 s by default
here). Offsets are committed only by `commit`; a group with no committed offset starts at
the earliest record.

Offsets. Kafka's offsets are per topic-partition; the port's `LogRecord.offset` is one
integer. `read` hands out a sequence number per record, increasing over the adapter's
life, and remembers the (topic, partition, Kafka offset) each stands for.
`commit(consumer, seq)` commits synchronously, for every topic-partition, the highest
Kafka offset + 1 among the records handed out with a sequence number <= seq. Within a
partition sequence numbers follow Kafka offsets, so this is exactly "everything up to
seq is done". Sequence numbers mean something only to the adapter that handed them out.

Redelivery (at-least-once). As the port says, `read` moves on from what it last handed
out, like any Kafka consumer, and commits are the consumer's to make when it has done
the work (a watcher commits every so many records, not every batch). Whatever is never
committed comes back to the member that owns its partition after a rebalance or a
restart. Records of partitions revoked in a rebalance
are forgotten rather than committed: a member never commits for a partition it no
longer owns.

An adapter is not thread-safe: use one per thread.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # where confluent_kafka.admin's comes from, typed

from sco.adapters.kafka import errors
from sco.adapters.kafka.errors import EventLogError, EventLogRejected, EventLogUnavailable
from sco.domain.events import LifecycleEvent
from sco.ports import LogRecord

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "sco.events."
DEAD_LETTERS = "dead-letters"  # the dead-letter topic is <prefix>dead-letters

_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_ILLEGAL_CHAR = re.compile(r"[^a-zA-Z0-9._-]")
_MAX_TOPIC_LEN = 249
_MAX_BATCH = 1_000_000  # the most confluent-kafka's consume() takes
_FLUSH_MARGIN_S = 5.0  # past message.timeout.ms, for the last delivery reports to arrive


def region_topic(prefix: str, region: str) -> str:
    """The topic of a region: the prefix and the region, with every character Kafka does
    not allow in topic names replaced by `_`."""
    if not region:
        raise ValueError("a region topic needs a region; got an empty one")
    topic = prefix + _ILLEGAL_CHAR.sub("_", region)
    if len(topic) > _MAX_TOPIC_LEN:
        raise ValueError(f"topic {topic!r} is longer than Kafka's {_MAX_TOPIC_LEN} characters")
    return topic


class _Origin(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass
class _Member:
    """One consumer group's client and the records it handed out, not yet committed."""

    client: Consumer
    pending: OrderedDict[int, _Origin] = field(default_factory=OrderedDict)  # by sequence


_Out = tuple[str, bytes | None, bytes, list[tuple[str, str | bytes | None]]]


class KafkaEventLog:
    """The `EventLog` port on Kafka; see the module docstring for layout and offsets."""

    def __init__(
        self,
        bootstrap_servers: str,
        config: Mapping[str, Any] | None = None,
        *,
        producer_config: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        topic_prefix: str = DEFAULT_PREFIX,
        regions: Sequence[str] | None = None,
        new_topic_partitions: int | None = None,
        poll_timeout_s: float = 0.1,
        delivery_timeout_s: float = 30.0,
    ) -> None:
        """Connect lazily to `bootstrap_servers` (`host:port[,host:port...]`).

        config: extra librdkafka properties for every client (security, timeouts);
        producer_config, consumer_config: extra properties for the producer or the
            consumers only (batching; group timeouts). None of them turns off
            idempotence, acks=all or manual commits.
        topic_prefix: region topics are `<prefix><region>`, dead letters go to
            `<prefix>dead-letters`.
        regions: the regions consumers subscribe to; None subscribes to `^<prefix>`.
        new_topic_partitions: when set, topics missing from the cluster are created with
            this many partitions (replication: the brokers' default); when None they must
            exist or the brokers create them.
        poll_timeout_s: seconds `read` waits for a first record before returning none.
        delivery_timeout_s: seconds `append` and `dead_letter` wait for acknowledgements.
        """
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one broker")
        if not _LEGAL_TOPIC.fullmatch(topic_prefix):
            raise ValueError(f"topic_prefix must be non-empty, of [a-zA-Z0-9._-]: {topic_prefix!r}")
        if new_topic_partitions is not None and new_topic_partitions < 1:
            raise ValueError(f"new_topic_partitions must be >= 1, got {new_topic_partitions}")
        if poll_timeout_s < 0:
            raise ValueError(f"poll_timeout_s must be >= 0, got {poll_timeout_s}")
        if delivery_timeout_s <= 0:
            raise ValueError(f"delivery_timeout_s must be > 0, got {delivery_timeout_s}")
        self.prefix = topic_prefix
        self.dead_letter_topic = topic_prefix + DEAD_LETTERS
        if regions is not None:
            if not regions:
                raise ValueError("regions must name at least one region, or be None for all")
            self._topics = sorted({region_topic(topic_prefix, r) for r in regions})
            if self.dead_letter_topic in self._topics:
                raise ValueError(
                    f"regions: a region's topic is the dead-letter topic {self.dead_letter_topic!r}"
                )
            self._subscription = list(self._topics)
        else:
            self._topics = []
            self._subscription = ["^" + topic_prefix.replace(".", r"\.") + ".*"]
        self._new_topic_partitions = new_topic_partitions
        self._poll_timeout_s = poll_timeout_s
        self._delivery_timeout_s = delivery_timeout_s
        self._client: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "error_cb": errors.client_error,
            "logger": logging.getLogger(f"{__name__}.librdkafka"),
            **(config or {}),
        }
        self._producer_config = {
            "linger.ms": 5,
            # One pool's events hash to the same partition as from the Java clients.
            "partitioner": "murmur2_random",
            **self._client,
            **(producer_config or {}),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(delivery_timeout_s * 1000),
        }
        self._consumer_config = {
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            # A region topic created after a consumer subscribed (its first events) is
            # found at the next metadata refresh: librdkafka's default waits 5 minutes.
            "topic.metadata.refresh.interval.ms": 5000,
            **self._client,
            **(consumer_config or {}),
            "enable.auto.commit": False,
        }
        strategy = self._consumer_config.get("partition.assignment.strategy", "")
        self._cooperative = "cooperative" in str(strategy)
        self._producer = Producer(self._producer_config)
        self._admin: AdminClient | None = None
        self._members: dict[str, _Member] = {}
        self._sequence = itertools.count(1)
        self._topic_of: dict[str, str] = {}  # pool -> topic
        self._known_topics: set[str] = set()  # exist or were created by this adapter
        self._closed = False

    # ---------------------------------------------------------------- appending

    def topic_for(self, pool: str) -> str:
        """The topic of a pool's events: its region's."""
        topic = self._topic_of.get(pool)
        if topic is None:
            topic = region_topic(self.prefix, pool.split("/", 1)[0])
            if topic == self.dead_letter_topic:
                raise ValueError(f"pool {pool!r}: its region's topic is the dead-letter topic")
            self._topic_of[pool] = topic
        return topic

    def append(self, events: Sequence[LifecycleEvent]) -> None:
        self.append_raw([(e.event_id, e.pool, e.dumps()) for e in events])

    def append_raw(self, rows: Sequence[tuple[str, str, str | bytes]]) -> None:
        """Append (event_id, pool, payload) as given: tests use it to put what a broken
        producer would, bytes that are not UTF-8 included."""
        self._send(
            "append",
            [
                (
                    self.topic_for(pool),
                    pool.encode(),
                    payload if isinstance(payload, bytes) else payload.encode(),
                    [("event_id", event_id)],
                )
                for event_id, pool, payload in rows
            ],
        )

    def dead_letter(self, consumer: str, record: LogRecord, error: str) -> None:
        member = self._members.get(consumer)
        origin = member.pending.get(record.offset) if member is not None else None
        headers: list[tuple[str, str | bytes | None]] = [
            ("consumer", consumer),
            ("error", error),
            ("sequence", str(record.offset)),
        ]
        if origin is None:
            log.warning(
                "%s: parking record %d without its origin: it was not handed out by this "
                "adapter or is committed already",
                consumer,
                record.offset,
            )
        else:
            headers += [
                ("original_topic", origin.topic),
                ("original_partition", str(origin.partition)),
                ("original_offset", str(origin.offset)),
            ]
        payload = record.payload.encode("utf-8", "surrogateescape")  # the bytes as read
        key = origin.key if origin is not None else None
        self._send("dead_letter", [(self.dead_letter_topic, key, payload, headers)])

    def _send(self, what: str, records: Sequence[_Out]) -> None:
        """Produce and wait until the brokers acknowledged every record, or raise."""
        self._check_open()
        if not records:
            return
        self._ensure_topics({topic for topic, _, _, _ in records})
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        producer = self._producer
        try:
            for topic, key, value, headers in records:
                try:
                    producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=delivered
                    )
                except BufferError:
                    # The client's queue is full: let deliveries make room, then once more.
                    producer.flush(self._delivery_timeout_s)
                    producer.produce(
                        topic, value=value, key=key, headers=headers, on_delivery=delivered
                    )
        except BufferError as e:
            self._drop_queued()
            raise EventLogUnavailable(f"{what}: the client's queue stayed full") from e
        except KafkaException as e:
            self._drop_queued()
            raise self._producer_error(what, [e.args[0]]) from e
        left = producer.flush(self._delivery_timeout_s + _FLUSH_MARGIN_S)
        if left:
            self._drop_queued()
            raise EventLogUnavailable(
                f"{what}: {left} of {len(records)} records not acknowledged in "
                f"{self._delivery_timeout_s:.0f}s"
            )
        if failed:
            raise self._producer_error(what, failed, of=len(records))

    def _drop_queued(self) -> None:
        """Forget records not yet sent, so a dead broker does not pile them up; those in
        flight may still land (the caller retries, consumers dedupe)."""
        self._producer.purge(in_queue=True, in_flight=False)
        self._producer.poll(0)

    def _producer_error(
        self, what: str, failures: Sequence[KafkaError], of: int = 0
    ) -> EventLogError:
        if any(e.fatal() or e.code() in errors.NEW_PRODUCER for e in failures):
            # An idempotent producer that was fenced takes no more records; a new one
            # (new producer id) does, and the caller's retry goes there.
            log.warning("%s: a new Kafka producer: the last one was fenced", what)
            self._producer.purge()
            self._producer = Producer(self._producer_config)
        counts = Counter(f"{e.name()} ({e.str()})" for e in failures)
        summary = ", ".join(f"{n}x {reason}" for reason, n in counts.items())
        message = f"{what}: {len(failures)}{f' of {of}' if of else ''} records failed: {summary}"
        if any(e.code() in errors.PERMANENT for e in failures):
            return EventLogRejected(message)
        return EventLogUnavailable(message)

    def _ensure_topics(self, topics: Iterable[str]) -> None:
        if self._new_topic_partitions is None:
            return
        missing = sorted(t for t in topics if t not in self._known_topics)
        if not missing:
            return
        if self._admin is None:
            self._admin = AdminClient(self._client)
        futures = self._admin.create_topics(
            [NewTopic(t, self._new_topic_partitions) for t in missing],
            request_timeout=self._delivery_timeout_s,
        )
        for topic, future in futures.items():
            try:
                future.result()
            except KafkaException as e:
                err: KafkaError = e.args[0]
                if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    message = f"creating topic {topic}: {err.name()} ({err.str()})"
                    if err.code() in errors.PERMANENT:
                        raise EventLogRejected(message) from e
                    raise EventLogUnavailable(message) from e
            self._known_topics.add(topic)

    # ---------------------------------------------------------------- consuming

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        """Up to `limit` records after what this member read last (at first, after the
        group's committed offsets); waits at most `poll_timeout_s` for the first, and
        returns none while the group is forming."""
        if limit < 1:
            return []
        member = self._member(consumer)
        client = member.client
        limit = min(limit, _MAX_BATCH)
        try:
            batch = client.consume(limit, 0)  # what is fetched already
            if not batch:
                batch = client.consume(1, self._poll_timeout_s)
                if batch and limit > 1:
                    batch += client.consume(limit - 1, 0)
        except KafkaException as e:
            raise errors.consumer_error(f"{consumer}: read", e.args[0]) from e
        records: list[LogRecord] = []
        for msg in batch:
            err = msg.error()
            if err is not None:
                errors.on_message_error(consumer, err)
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None
            assert partition is not None
            assert offset is not None
            seq = next(self._sequence)
            member.pending[seq] = _Origin(topic, partition, offset, msg.key())
            value = msg.value()
            # surrogateescape keeps bytes that are not UTF-8, for the dead-letter topic.
            payload = "" if value is None else value.decode("utf-8", "surrogateescape")
            records.append(LogRecord(seq, payload))
        return records

    def commit(self, consumer: str, offset: int) -> None:
        """Commit every record this adapter handed out to `consumer` with a sequence
        number <= `offset`, synchronously."""
        member = self._members.get(consumer)
        if member is None or not member.pending:
            return
        done: list[int] = []
        upto: dict[tuple[str, int], int] = {}
        for seq, origin in member.pending.items():
            if seq > offset:
                break
            done.append(seq)
            tp = (origin.topic, origin.partition)
            upto[tp] = max(upto.get(tp, -1), origin.offset)
        if not done:
            return
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in upto.items()]
        try:
            results = member.client.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.code() in errors.REBALANCED:
                log.warning(
                    "%s: commit lost to a rebalance (%s): the records will be read again",
                    consumer,
                    err.name(),
                )
                return
            raise errors.consumer_error(f"{consumer}: commit", err) from e
        for result in results:
            if result.error is not None:
                where = f"{consumer}: commit {result.topic}[{result.partition}]"
                raise errors.consumer_error(where, result.error)
        for seq in done:
            del member.pending[seq]

    def _member(self, consumer: str) -> _Member:
        member = self._members.get(consumer)
        if member is not None:
            return member
        self._check_open()
        if not consumer:
            raise ValueError("a consumer needs a name: it is the Kafka consumer group")
        self._ensure_topics(self._topics)
        client = Consumer({**self._consumer_config, "group.id": consumer})
        member = _Member(client)

        def assigned(c: Consumer, partitions: list[TopicPartition]) -> None:
            # A regex subscription matches the dead-letter topic too: never consume it.
            kept = [tp for tp in partitions if tp.topic != self.dead_letter_topic]
            if len(kept) < len(partitions):
                if self._cooperative:
                    c.incremental_assign(kept)
                else:
                    c.assign(kept)

        def revoked(_c: Consumer, partitions: list[TopicPartition]) -> None:
            gone = {(tp.topic, tp.partition) for tp in partitions}
            dropped = [s for s, o in member.pending.items() if (o.topic, o.partition) in gone]
            for seq in dropped:
                del member.pending[seq]
            if dropped:
                log.info(
                    "%s: %d uncommitted records of revoked partitions go to their next owner",
                    consumer,
                    len(dropped),
                )

        client.subscribe(self._subscription, on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        self._members[consumer] = member
        return member

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Leave every consumer group (its partitions move to other members at once) and
        wait for records still on their way. Uncommitted records are read again."""
        if self._closed:
            return
        self._closed = True
        for member in self._members.values():
            member.client.close()
        self._members.clear()
        left = self._producer.flush(self._delivery_timeout_s)
        if left:
            log.warning("closing with %d records not acknowledged", left)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EventLogError("the event log is closed")
