"""The event log: lifecycle events appended once, read by consumers from their commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from sco.domain.events import LifecycleEvent


class LogRecord(NamedTuple):
    """One entry of the event log, as read: the raw payload, so consumers see bad ones.
    A NamedTuple: a consumer reads a hundred thousand a second."""

    offset: int
    payload: str


class EventLog(Protocol):
    """An append-only stream of lifecycle events with per-consumer offsets."""

    def append(self, events: Sequence[LifecycleEvent]) -> None:
        """Append; an event id already in the log is not appended again where the log can
        tell (consumers still dedupe by event id)."""
        ...

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        """Up to `limit` records after this reader's position for `consumer`: its
        committed offset at the first read, then just past what it last read. What was
        read but not committed is read again after a restart (at-least-once)."""
        ...

    def commit(self, consumer: str, offset: int) -> None:
        """Everything up to and including `offset` is done for `consumer`."""
        ...

    def dead_letter(self, consumer: str, record: LogRecord, error: str) -> None:
        """Park a record the consumer could not read."""
        ...
