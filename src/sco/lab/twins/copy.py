"""A lab run's fleet state, copied from the in-memory twin into a database.

A run on the twins is faster than one on SQLite and ends with the same state
(tests/conformance/ holds them to the same rules; a run gives the
same outcomes on both). `sco demo` and `sco simulate --state` run on the twins
and copy the end state into the file that `sco explain`, `sco pools` and
`sco status` read: every change replayed through the store's own writes (so
every record and history row is what the SQL run would have written), the
plans, the pools' ages, exclusions and latest scores, and the operators'
intents. What the copy does not carry: reservations still open (a run's end
is not a cycle's) and the outbox (the run's events went to its own event log;
the copy writes none for its records, and drops its exclusions', not sent twice).
"""

from __future__ import annotations

import dataclasses

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.events import LifecycleEvent
from sco.lab.twins.fleet import MemoryFleetStore

CHUNK = 5_000  # changes per transaction


def copy_fleet(src: MemoryFleetStore, dst: SqlFleetStore) -> int:
    """Copy `src` (kept with `keep_changes`) into the empty store `dst`; returns the
    changes replayed."""
    dst.upsert_pools(src.pools())
    changes = src.changes()
    for start in range(0, len(changes), CHUNK):
        dst.record(changes[start : start + CHUNK])
    dst.save_plans(src.plans())
    for pool, up_since in src.pool_ages().items():
        dst.set_pool_age(pool, up_since)
    for ex in src.exclusions().values():
        event = LifecycleEvent(
            event_id=f"exclusion:{ex.pool}:copied",
            at=ex.last_crossing,
            partition="",
            pool=ex.pool,
            instance=None,
            kind=str(ex.state),
            reason="copied from the run's fleet state",
        )
        dst.put_exclusion(dataclasses.replace(ex, version=0), event)
    scores = list(src.latest_scores().values())
    if scores:
        dst.save_scores(scores)
    for partition, (intent, at, by) in src.intent_rows().items():
        dst.put_intent(partition, intent, at, by)
    while dst.relay_outbox(_drop, 10_000):
        pass
    return len(changes)


def copy_into(twin: MemoryFleetStore, url: str) -> int:
    """Copy the twin into the (new) database at `url`; returns the changes replayed."""
    # As a run on it, no node reads a contract.
    copied = SqlFleetStore(url, contracts=False, outbox=False)
    try:
        return copy_fleet(twin, copied)
    finally:
        copied.close()


def _drop(events: list[LifecycleEvent]) -> None:
    """The copy's events are not news: the run's event log had them."""
