"""Partitions placing into shared pools concurrently never overbook them.

A hypothesis state machine interleaves, across three partitions, the steps
each controller takes: read a pool's version and reservations (a snapshot
that may go stale), reserve on that snapshot through the store's
compare-and-swap, have the provider create what was reserved, and sweep
stale reservations. Whatever the interleaving, what a pool holds plus what
is reserved in it never exceeds its capacity.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.lifecycle import State
from sco.ports import NewRequest, Reservation, StateConflict
from sco_harness.builders import instance, spot_pool

POOLS = [spot_pool(zone="a"), spot_pool(zone="b")]
CAPACITY = 5
PARTITIONS = ["p1", "p2", "p3"]


class SharedPools(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.TemporaryDirectory()
        self.store = SqlFleetStore(sqlite_url(Path(self.folder.name) / "fleet.db"))
        self.store.upsert_pools(POOLS)
        self.servers = dict.fromkeys((p.id for p in POOLS), 0)  # what the provider holds
        self.snapshots: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.pending: list[Reservation] = []
        self.ids = itertools.count()
        self.now = 0.0

    def teardown(self) -> None:
        self.store.close()
        self.folder.cleanup()

    @rule(partition=st.sampled_from(PARTITIONS), pool=st.sampled_from(POOLS))
    def snapshot(self, partition: str, pool: object) -> None:
        """A controller observes: pool version, reservations, and provider headroom."""
        assert hasattr(pool, "id")
        record = self.store.pool_records()[pool.id]
        headroom = CAPACITY - self.servers[pool.id]
        self.snapshots[(partition, pool.id)] = (record.version, record.reserved, headroom)

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data(), want=st.integers(1, 4))
    def reserve(self, data: st.DataObject, want: int) -> None:
        """It acts on its snapshot, however old: the acquirer's own arithmetic."""
        (partition, pool_id), (version, reserved, headroom) = data.draw(
            st.sampled_from(sorted(self.snapshots.items()))
        )
        count = min(want, headroom - reserved)
        if count <= 0:
            return
        pool = next(p for p in POOLS if p.id == pool_id)
        rid = f"req-{next(self.ids)}"
        res = Reservation(rid, pool_id, partition, count, self.now, self.now + 600)
        records = tuple(
            dataclasses.replace(
                instance(pool, State.REQUESTED, partition_name=partition), request_id=rid
            )
            for _ in range(count)
        )
        try:
            self.store.reserve(NewRequest(res, records, version))
        except StateConflict:
            return  # someone reserved in this pool since the snapshot
        self.pending.append(res)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data(), accepted_share=st.floats(0, 1))
    def provider_creates(self, data: st.DataObject, accepted_share: float) -> None:
        """The create is answered (maybe in part) and its servers observed."""
        res = data.draw(st.sampled_from(self.pending))
        self.pending.remove(res)
        accepted = int(res.count * accepted_share)
        self.servers[res.pool] += accepted
        self.store.settle_reservation(res.request_id, 0)

    @rule(dt=st.floats(0, 900))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        swept = {r.request_id for r in self.store.reservations() if r.expires_at <= self.now}
        self.store.sweep_reservations(self.now)
        # A swept reservation's create never came back: its servers never appear.
        self.pending = [r for r in self.pending if r.request_id not in swept]

    @invariant()
    def never_overbooked(self) -> None:
        reserved = self.store.pool_records()
        for pool in POOLS:
            held = self.servers[pool.id] + reserved[pool.id].reserved
            assert held <= CAPACITY, f"{pool.id}: {held} > {CAPACITY}"


SharedPools.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_shared_pools_are_never_overbooked = SharedPools.TestCase
