"""A partition's records as its controller holds them between cycles: its instances and
its plan, loaded from fleet state once and then kept current by the controller's own
writes (sco is their one writer), every write a compare-and-swap carrying the fencing
token of the partition's lease. A write that loses its race drops the cache, which
the next `load` reads afresh; one refused by the fence raises `FencedOut`, and the
controller stops."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from sco.domain.instances import Change, Instance
from sco.domain.lifecycle import State
from sco.domain.plans import Plan
from sco.domain.pools import PoolId
from sco.ports import (
    Fence,
    FencedOut,
    InstanceStore,
    NewRequest,
    PlanStore,
    PoolRecord,
    StateConflict,
)

log = logging.getLogger("sco.engine.controller")


class RecordStore(InstanceStore, PlanStore, Protocol):
    """What a partition's records are kept in: its instances and reservations, its plans."""


class Records:
    """The partition's instance records, plan and open requests."""

    def __init__(self, partition: str, store: RecordStore, fence: Fence) -> None:
        self.partition = partition
        self.store = store
        self.fence = fence
        self._records: dict[str, Instance] | None = None
        self._plan: Plan | None = None
        self._plan_loaded = False
        # Requests whose reservation is still open, as far as this controller knows.
        self.open_requests: set[str] = set()

    # ------------------------------------------------------------ reading

    def load(self) -> dict[str, Instance]:
        """The records, read from fleet state if the cache was dropped."""
        if self._records is None:
            self._records = {i.id: i for i in self.store.instances(self.partition)}
            self.open_requests = self._open_in_store()
        if not self._plan_loaded:
            self._plan = self.store.latest_plan(self.partition)
            self._plan_loaded = True
        return self._records

    @property
    def stale(self) -> bool:
        """A write of this cycle lost its race: what it knew is gone until `load`."""
        return self._records is None

    def held(self) -> dict[str, Instance]:
        """The records as held now (empty when stale)."""
        return self._records or {}

    def live(self) -> list[Instance]:
        return list((self._records or {}).values())

    def get(self, instance_id: str) -> Instance | None:
        return (self._records or {}).get(instance_id)

    def forget(self) -> None:
        """Drop the cache: the next `load` reads fleet state again."""
        self._records = None

    @property
    def plan(self) -> Plan | None:
        return self._plan

    # ------------------------------------------------------------ writing

    def commit(self, changes: Sequence[Change], settle: Mapping[str, int] | None = None) -> int:
        """Persist changes (and settle reservations) and update the cache; on a lost
        race drop the cache and return 0. Returns the transitions recorded."""
        if not changes and not settle:
            return 0
        try:
            self.store.record(changes, settle, fence=self.fence.token)
        except StateConflict as e:
            self._records = None
            if isinstance(e, FencedOut):
                raise  # another leader writes now: this controller stops (its runner says so)
            log.warning("partition %s: %s; reloading", self.partition, e)
            return 0
        assert self._records is not None
        for ch in changes:
            if ch.after.state is State.GONE:
                self._records.pop(ch.after.id, None)
            else:
                self._records[ch.after.id] = ch.after
        if log.isEnabledFor(logging.INFO):
            for ch in changes:
                _log_transition(ch)
        return len(changes)

    def reserve(self, request: NewRequest) -> bool:
        """Write a request's reservation and REQUESTED records; False when another
        writer reserved in its pool first (the cache is kept: nothing was written)."""
        try:
            self.store.reserve(request, fence=self.fence.token)
        except FencedOut:
            raise
        except StateConflict as e:
            log.info("partition %s: reservation lost a race: %s", self.partition, e)
            return False
        assert self._records is not None
        for i in request.instances:
            self._records[i.id] = i
        self.open_requests.add(request.reservation.request_id)
        return True

    def publish(self, plan: Plan) -> Plan:
        """Store a new plan generation; on a lost race keep the current one (or this,
        if none) and read plans again on the next load."""
        current = self._plan
        try:
            self.store.save_plan(plan, fence=self.fence.token)
        except FencedOut:
            self._plan_loaded = False
            raise
        except StateConflict as e:
            log.warning("partition %s: %s; reloading plan", self.partition, e)
            self._plan_loaded = False
            return current or plan
        self._plan = plan
        return plan

    def sweep(self, now: float) -> int:
        """Drop every expired reservation (any partition's); returns how many."""
        swept = self.store.sweep_reservations(now)
        if swept:
            log.info("swept %d stale reservations", swept)
            self.open_requests = self._open_in_store()
        return swept

    def _open_in_store(self) -> set[str]:
        return {r.request_id for r in self.store.reservations() if r.partition == self.partition}


def _log_transition(ch: Change) -> None:
    after = ch.after
    log.info(
        "partition %s: %s %s %s -> %s [%s] %s%s",
        after.partition,
        after.id,
        after.pool,
        ch.before.state if ch.before else "new",
        after.state,
        ch.code or (ch.trigger or "created"),
        ch.reason,
        f" (server {after.server_id})" if after.server_id else "",
    )


class PoolLedger:
    """The pools' compare-and-swap versions and pending reservations, read at most every
    `refresh_s` for planning, and afresh before every reservation."""

    def __init__(self, store: InstanceStore, refresh_s: float) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._records: Mapping[PoolId, PoolRecord] = {}
        self._read_at = float("-inf")

    def read(self, now: float, fresh: bool = False) -> Mapping[PoolId, PoolRecord]:
        if fresh or now - self._read_at >= self.refresh_s:
            self._records = self.store.pool_records()
            self._read_at = now
        return self._records
