"""The outbox relay: moves events written with state changes to the event log.

At-least-once: the log skips (or consumers drop) event ids it already has, so
a crash between appending and clearing the outbox duplicates nothing, and a
crash before appending loses nothing.
"""

from __future__ import annotations

from sco.ports import EventLog, FleetStore


def relay(store: FleetStore, log: EventLog, batch: int = 1000) -> int:
    """Relay everything in the outbox now; returns how many events moved."""
    moved = 0
    while True:
        rows = store.outbox_batch(batch)
        if not rows:
            return moved
        log.append([event for _, event in rows])
        store.outbox_done(rows[-1][0])
        moved += len(rows)
        if len(rows) < batch:
            return moved
