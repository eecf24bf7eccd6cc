"""What the Kafka brokers and client answer, sorted by what the caller does next:
try again later (`EventLogUnavailable`), or change the configuration
(`EventLogRejected`); and which refusals mean a new producer, or a lost rebalance."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError

log = logging.getLogger("sco.adapters.kafka.eventlog")

# Refusals that do not go away by themselves: configuration, authorisation, size.
PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.INVALID_CONFIG,
        KafkaError.UNSUPPORTED_VERSION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._INVALID_ARG,
        KafkaError.FENCED_INSTANCE_ID,
    }
)
# A commit that lost to a rebalance: the partitions' new owners read the records again.
# What an idempotent producer answers once its producer id or epoch is no longer the
# broker's (its records timed out while the broker was away, and the broker fenced
# it): it takes no more records, and a delivery error says so without being marked
# fatal. A new producer, with a new id, does.
NEW_PRODUCER = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError._FENCED,
        KafkaError._FATAL,
    }
)

REBALANCED = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._ASSIGNMENT_LOST,
    }
)


class EventLogError(Exception):
    """Base of everything the Kafka event log raises."""


class EventLogUnavailable(EventLogError):
    """The brokers did not take or give the records now (down, slow, rebalancing): the
    same call may succeed later. After a failed append some of its records may be in
    the log already; consumers dedupe by event id."""


class EventLogRejected(EventLogError):
    """The brokers refuse the request (authorisation, record size, topic name, a fenced
    client): retrying will not help until the configuration changes."""


def client_error(err: KafkaError) -> None:
    """Errors of the client as a whole (brokers down, authentication): it retries by
    itself; what fails for good surfaces as an error of a call."""
    log.warning("kafka client: %s (%s)", err.name(), err.str())


def on_message_error(consumer: str, err: KafkaError) -> None:
    """A consumer error event: informational unless fatal, as librdkafka recovers."""
    if err.code() == KafkaError._PARTITION_EOF:
        return
    if err.fatal():
        raise consumer_error(f"{consumer}: read", err)
    if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        log.warning("%s: %s (a region with no events yet?)", consumer, err.str())
    else:
        log.warning("%s: %s (%s)", consumer, err.name(), err.str())


def consumer_error(what: str, err: KafkaError) -> EventLogError:
    message = f"{what}: {err.name()} ({err.str()})"
    if err.fatal() or err.code() in PERMANENT:
        return EventLogRejected(message)
    return EventLogUnavailable(message)
