"""What a partition's controller holds between cycles, and what every phase of its
cycle (`sync`, `planning`, `act`, `controller`) shares: the records cache, written
through the store's compare-and-swap and dropped on a conflict, the pools' records,
what nodes said of their end, and the tally of the cycle in progress."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sco.decide.acquirer import ActConfig
from sco.decide.policies import Policy
from sco.domain.demand import Partition
from sco.domain.instances import Change, Instance
from sco.domain.lifecycle import State
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.engine.calls import Outbound
from sco.engine.clock import IdSource
from sco.engine.signals import FleetSignals, SignalReader
from sco.engine.tokens import TokenIssuer
from sco.ports import (
    Clock,
    DemandSource,
    FencedOut,
    InstanceStore,
    NodeView,
    PlanStore,
    PoolRecord,
    Provider,
    SchedulerCluster,
    ServerView,
    StateConflict,
)

log = logging.getLogger("sco.engine.controller")
GONE = NodeView(joined=False, drained=False)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    act: ActConfig = field(default_factory=ActConfig)
    reservation_ttl_s: float = 600.0  # a reservation not seen as servers by then is swept
    list_grace_s: float = 60.0  # a new server may take this long to show in listings
    sweep_every_s: float = 600.0  # how often stale reservations are swept
    pool_refresh_s: float = 600.0  # planning may use pool reservation counts this old;
    # a create always re-reads them before it reserves
    measured_cold_start_n: int = 5  # readies in history before their median is the cold start
    # A ready node its scheduler has not listed as up for this long (a slurmctld that
    # lost its registration in a crash, a kubelet gone) is capacity no work reaches:
    # it fails, and its server is deleted and replaced.
    node_lost_after_s: float = 300.0


@dataclass
class CycleTally:
    """What one cycle did, for its report."""

    delays: list[float] = field(default_factory=list)
    acted: Counter[tuple[str, str]] = field(default_factory=Counter)
    reclaims: Counter[tuple[PoolId, str]] = field(default_factory=Counter)
    replaced: Counter[PoolId] = field(default_factory=Counter)
    created: int = 0  # instances whose creates the cloud took
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds, by PHASES
    _lap_at: float = field(default_factory=time.perf_counter)

    def lap(self, phase: str) -> None:
        """Close a phase: the wall time since the last lap counts toward `phase` (a
        phase may come back, as planning does around publishing the plan)."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._lap_at
        self._lap_at = now


class ControllerStore(InstanceStore, PlanStore, SignalReader, Protocol):
    """What a partition's controller reads and writes of fleet state: its records and
    reservations, its plans, and (for its own signals reader) the pools' signals."""


class PartitionState:
    """The controller's state; the phases are mixins over it."""

    partition: Partition
    provider: Provider
    nodes: SchedulerCluster
    store: ControllerStore
    demand: DemandSource
    policy: Policy
    clock: Clock
    ids: IdSource
    signals: FleetSignals
    config: ControllerConfig
    tokens: TokenIssuer | None  # node tokens for the contract distributor's agents
    _pools: dict[PoolId, Pool]
    _records: dict[str, Instance] | None  # the partition's records: sco is their one writer
    _plan: Plan | None
    _plan_loaded: bool
    _open_requests: set[str]
    _last_sweep: float
    _pool_records: Mapping[PoolId, PoolRecord]
    _pool_records_at: float
    _node_notes: dict[str, str]  # server id -> what its leaving cuts short
    _owed: int  # spot reclaimed and not yet replaced: creates count as replacements
    _seen: set[str]  # server ids some listing showed
    _quiet: dict[str, tuple[Instance, ServerView, NodeView]]
    _unjoined: dict[str, float]  # server id -> first cycle its READY node was not
    _batch: dict[PoolId, int]  # a pool's batch after refusals (default: max)
    _refused_at: dict[PoolId, float]  # the last create a pool refused
    _refusals: Counter[PoolId]
    _acceptances: Counter[PoolId]
    _cycle: CycleTally
    _outbound: Outbound  # creates and deletes sent, their answers not yet recorded

    def _load(self) -> dict[str, Instance]:
        if self._records is None:
            self._records = {i.id: i for i in self.store.instances(self.partition.name)}
            self._open_requests = {
                r.request_id
                for r in self.store.reservations()
                if r.partition == self.partition.name
            }
        if not self._plan_loaded:
            self._plan = self.store.latest_plan(self.partition.name)
            self._plan_loaded = True
        return self._records

    def _live(self) -> list[Instance]:
        return list((self._records or {}).values())

    def _commit(self, changes: Sequence[Change], settle: Mapping[str, int] | None = None) -> int:
        """Persist changes (and settle reservations) and update the cache; on conflict
        drop the cache."""
        if not changes and not settle:
            return 0
        try:
            self.store.record(changes, settle)
        except StateConflict as e:
            self._records = None
            if isinstance(e, FencedOut):
                raise  # another leader writes now: this controller stops (its runner says so)
            log.warning("partition %s: %s; reloading", self.partition.name, e)
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

    def _keep_notes(self, servers: Sequence[ServerView], nodes: Mapping[str, NodeView]) -> None:
        """Remember what the scheduler said of each node until its server's end is
        recorded: a reclaimed server is often gone from the listing by then."""
        notes = self._node_notes
        notes.update({s: v.note for s, v in nodes.items() if v.note})
        keep = {i.server_id for i in self._live() if i.server_id} | {v.server_id for v in servers}
        for s in [s for s in notes if s not in keep]:
            del notes[s]

    def _noted(self, inst: Instance, why: str) -> str:
        """`why` with what the scheduler said leaving cuts short (jobs it could not
        requeue), so that the event of the node's end reports it."""
        note = self._node_notes.get(inst.server_id or "")
        return f"{why}; {note}" if note else why

    def _records_of_pools(self, now: float, fresh: bool = False) -> Mapping[PoolId, PoolRecord]:
        if fresh or now - self._pool_records_at >= self.config.pool_refresh_s:
            self._pool_records = self.store.pool_records()
            self._pool_records_at = now
        return self._pool_records


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
