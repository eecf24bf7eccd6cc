"""The outbox relay: moves events written with state changes to the event log.

At-least-once: the log skips (or consumers drop) event ids it already has, so
a crash between appending and clearing the outbox duplicates nothing, and a
crash before appending loses nothing.
"""

from __future__ import annotations

from sco.ports import EventLog, Outbox


def relay(store: Outbox, log: EventLog, batch: int = 1000) -> int:
    """Relay everything in the outbox now; returns how many events moved. Several
    relays may run at once (replicas): each batch is held by one of them."""
    moved = 0
    while True:
        n = store.relay_outbox(log.append, batch)
        moved += n
        if n < batch:
            return moved
