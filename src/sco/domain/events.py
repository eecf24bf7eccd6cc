"""Lifecycle events: immutable records of a change of an instance or a pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sco.domain.instances import Change

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    event_id: str
    at: float
    partition: str
    pool: str
    instance: str | None
    kind: str
    reason: str
    from_state: str | None = None
    to_state: str | None = None
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
        }


def event_of(change: Change, event_id: str) -> LifecycleEvent:
    """The event a recorded transition publishes; `kind` is its trigger."""
    after = change.after
    return LifecycleEvent(
        event_id=event_id,
        at=change.at,
        partition=after.partition,
        pool=after.pool,
        instance=after.id,
        kind=str(change.trigger) if change.trigger else "recorded",
        reason=change.reason,
        from_state=str(change.before.state) if change.before else None,
        to_state=str(after.state),
    )
