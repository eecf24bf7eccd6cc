"""Lifecycle events: immutable records of a change of an instance or a pool.

Events travel as JSON with a schema version. `parse_event` is strict: a
consumer parks anything it cannot read instead of guessing.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import orjson

from sco.domain.instances import Change

SCHEMA_VERSION = 1

# Kinds a pool signal may have besides the lifecycle triggers.
POOL_KINDS = frozenset({"excluded", "degraded", "exclusion_ended", "headroom"})
RECLAIM_KINDS = frozenset({"reclaim_notice", "server_vanished"})
CREATE_OK, CREATE_FAILED = "create_accepted", "create_failed"


class MalformedEvent(ValueError):
    """An event that does not follow the schema; the message says what is wrong."""


class LifecycleEvent(NamedTuple):
    """Immutable; a NamedTuple because consumers build hundreds of thousands a second."""

    event_id: str
    at: float
    partition: str
    pool: str
    instance: str | None
    kind: str
    reason: str
    from_state: str | None = None
    to_state: str | None = None
    value: float | None = None  # pool signals that carry a number (headroom)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "event_id": self.event_id,
            "at": self.at,
            "partition": self.partition,
            "pool": self.pool,
            "instance": self.instance,
            "kind": self.kind,
            "reason": self.reason,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "value": self.value,
        }

    def dumps(self) -> str:
        return orjson.dumps(self.to_json()).decode()


def event_of(change: Change) -> LifecycleEvent:
    """The event a recorded transition publishes; its id is the record's id and version,
    so a transition can never yield two different events."""
    after = change.after
    return LifecycleEvent(
        event_id=f"{after.id}:{after.version}",
        at=change.at,
        partition=after.partition,
        pool=after.pool,
        instance=after.id,
        kind=str(change.trigger) if change.trigger else "recorded",
        reason=change.reason,
        from_state=str(change.before.state) if change.before else None,
        to_state=str(after.state),
    )


_NUMBER = (int, float)


def _bad(doc: dict[str, Any]) -> str:
    """What is wrong with a decoded event (only called once the fast check failed)."""
    if doc.get("schema_version") != SCHEMA_VERSION:
        return f"unknown schema_version {doc.get('schema_version')!r}"
    for key in ("event_id", "partition", "pool", "kind", "reason"):
        if type(doc.get(key)) is not str:
            return f"{key} must be a string"
    for key in ("instance", "from_state", "to_state"):
        if doc.get(key) is not None and type(doc[key]) is not str:
            return f"{key} must be a string or null"
    at: Any = doc.get("at")
    if type(at) not in _NUMBER or not math.isfinite(at):
        return "at must be a finite number"
    return "value must be a number or null"


def decode_event(payload: str | bytes) -> dict[str, Any]:
    """Decode and check one event, leaving it a dict; raises MalformedEvent naming the
    problem. Consumers on a hot path read the fields they need from the dict.
    """
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise MalformedEvent(f"not JSON: {e}") from None
    if type(doc) is not dict:
        raise MalformedEvent("not a JSON object")
    get = doc.get
    try:
        # Subscripts, not get(): the required keys are checked without method calls.
        at: Any = doc["at"]
        ok = (
            doc["schema_version"] == SCHEMA_VERSION
            and type(doc["event_id"]) is str
            and type(doc["partition"]) is str
            and type(doc["pool"]) is str
            and type(doc["kind"]) is str
            and type(doc["reason"]) is str
            and type(at) in _NUMBER
            and math.isfinite(at)
        )
    except KeyError:
        ok = False
    if ok:
        try:
            instance, from_state, to_state = doc["instance"], doc["from_state"], doc["to_state"]
            value: Any = doc["value"]
        except KeyError:  # optional keys: absent reads as null
            instance, from_state, to_state = get("instance"), get("from_state"), get("to_state")
            value = get("value")
        ok = (
            (instance is None or type(instance) is str)
            and (from_state is None or type(from_state) is str)
            and (to_state is None or type(to_state) is str)
            and (value is None or type(value) in _NUMBER)
        )
    if not ok:
        raise MalformedEvent(_bad(doc))
    return doc


def parse_event(payload: str | bytes) -> LifecycleEvent:
    """Read one event; raises MalformedEvent naming the problem."""
    doc = decode_event(payload)
    value = doc.get("value")
    return LifecycleEvent(
        doc["event_id"],
        float(doc["at"]),
        doc["partition"],
        doc["pool"],
        doc.get("instance"),
        doc["kind"],
        doc["reason"],
        doc.get("from_state"),
        doc.get("to_state"),
        None if value is None else float(value),
    )
