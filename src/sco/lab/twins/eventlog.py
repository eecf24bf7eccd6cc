"""The event log in memory: the EventLog port without a database.

As the embedded SQL log: offsets count from 1 in the order appended, an event id
already in the log is skipped, each consumer's committed offset is kept, and a
reader starts at its commit and moves on as it reads. Payloads are kept as the
JSON text every log carries, so consumers parse them as they would any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from sco.domain.events import LifecycleEvent
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import LogRecord


class MemoryEventLog:
    def __init__(self, outbox_of: MemoryFleetStore | None = None) -> None:
        """`outbox_of`: the fleet state whose outbox `absorb_outbox` relays."""
        self.outbox_of = outbox_of
        self._records: list[LogRecord] = []
        self._ids: set[str] = set()
        self._committed: dict[str, int] = {}
        self._positions: dict[str, int] = {}
        self._dead: list[tuple[str, int, str, str]] = []

    def close(self) -> None:
        """Nothing to let go."""

    def restarted(self) -> MemoryEventLog:
        """The same log as a restarted process finds it: its records and commits, and
        readers that start again at the commit."""
        again = MemoryEventLog(self.outbox_of)
        again._records, again._ids = self._records, self._ids
        again._committed, again._dead = self._committed, self._dead
        return again

    def append(self, events: Sequence[LifecycleEvent]) -> None:
        self.append_raw([(e.event_id, e.pool, e.dumps()) for e in events])

    def append_raw(self, rows: Sequence[tuple[str, str, str]]) -> int:
        """Append (event_id, pool, payload) as given; returns how many were new."""
        new = 0
        for event_id, _pool, payload in rows:
            if event_id in self._ids:
                continue
            self._ids.add(event_id)
            self._records.append(LogRecord(len(self._records) + 1, payload))
            new += 1
        return new

    def absorb_outbox(self) -> int:
        """Relay the outbox of `outbox_of`; returns how many events were new to the log."""
        if self.outbox_of is None:
            return 0
        moved = [0]

        def append(events: list[LifecycleEvent]) -> None:
            moved[0] += self.append_raw([(e.event_id, e.pool, e.dumps()) for e in events])

        while self.outbox_of.relay_outbox(append, 100_000):
            pass
        return moved[0]

    def committed(self, consumer: str) -> int:
        return self._committed.get(consumer, 0)

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        after = self._positions.get(consumer)
        if after is None:
            after = self._positions[consumer] = self.committed(consumer)
        records = self._records[after : after + limit]  # offset k is the k-th record
        if records:
            self._positions[consumer] = records[-1].offset
        return records

    def commit(self, consumer: str, offset: int) -> None:
        self._committed[consumer] = offset

    def dead_letter(self, consumer: str, record: LogRecord, error: str) -> None:
        self._dead.append((consumer, record.offset, record.payload, error))

    def dead_letters(self) -> list[tuple[str, int, str, str]]:
        return list(self._dead)
