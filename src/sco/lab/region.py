"""A simulated region driven by traces: the provider and node plane on a virtual clock.

Each series is a spot pool whose capacity over time is the trace value (a 1
in a 0/1 trace stands for `pool_size` instances; a count trace's unit stands for
`pool_size` instances when one is given, else for one). Guaranteed pools, one per
hall, have a fixed quota. When a spot pool's capacity drops below what is
held there, the newest servers are reclaimed; with `notice_s > 0` the region
looks ahead in the trace and announces each reclaim that long before it.

Nothing sleeps: `advance_to(t)` applies every scheduled event up to `t`, and
`next_event_time()` tells the runner when the next one is due.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import CapacityClass, Pool, PoolId
from sco.lab.region_model import COLD_START_S, Kind, Server, SimConfig, SimObserver
from sco.lab.region_servers import ServerTable, Timeline
from sco.lab.region_sides import NodeSide, ReclaimerSide
from sco.lab.traces import TraceSet, hall_names
from sco.ports import (
    CreateResult,
    InsufficientCapacity,
    NodeView,
    PermanentProviderError,
    RetryableProviderError,
    Secret,
    ServerStatus,
    ServerView,
)

# SimConfig, SimObserver and COLD_START_S live in `region_model` (the region's parts
# import them from there); callers find them here, as before.
__all__ = ["COLD_START_S", "UNLIMITED", "SimConfig", "SimObserver", "SimRegion"]


UNLIMITED = 1_000_000

V = TypeVar("V")


def _from(changes: list[tuple[float, V]], start: float) -> list[tuple[float, V]]:
    """Change points from `start` on: the one in force at `start` moved to `start`."""
    before = [c for c in changes if c[0] <= start]
    after = [c for c in changes if c[0] > start]
    return ([(start, before[-1][1])] if before else []) + after


@dataclass
class SimRegion:
    """Provider and SchedulerCluster over a TraceSet, on a virtual clock starting at
    `start_s`; its scheduler's and reclaimer's sides are objects it holds, over its
    servers (`ServerTable`) and its events (`Timeline`)."""

    traces: TraceSet
    config: SimConfig = field(default_factory=SimConfig)
    start_s: float | None = None
    observer: SimObserver | None = None

    def __post_init__(self) -> None:
        spec = self.traces.region
        self.now = self.traces.start_s if self.start_s is None else self.start_s
        self._rng = random.Random(self.config.seed)
        self.events_applied = 0  # lets a runner tell whether anything happened
        # ... to pools (capacity and notices, then prices: every partition sees those),
        # and to each partition's own servers
        self.pool_events = 0
        self.price_events = 0
        self.server_events: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._timeline = Timeline()
        self._servers = ServerTable()
        self._node_side = NodeSide(self._servers, self._timeline)
        self._reclaimer_side = ReclaimerSide(self._servers, self._timeline)
        self._capacity: dict[PoolId, int] = {}
        self._announced: dict[PoolId, list[tuple[float, int]]] = {}
        self._room_at = (-1, -1)  # `room_moves` when `_room_now` was worked out
        self._room_now: dict[PoolId, int] = {}
        self._price: dict[PoolId, float] = {}
        self._pools: dict[PoolId, Pool] = {}
        self._series_of: dict[PoolId, int] = {}
        self._pending_capacity: dict[tuple[PoolId, float], int] = {}
        self._pending_price: dict[tuple[PoolId, float], float] = {}
        halls = hall_names(spec.halls)
        region = spec.name or self.traces.folder.name
        mean_spot = self.traces.mean_spot_price
        spot_default = spec.spot_price_per_h if spec.spot_price_per_h is not None else 1.0
        g_price = spec.guaranteed_price_per_h
        if g_price is None:
            g_price = 3.0 * (mean_spot if mean_spot is not None else spot_default)
        for i, s in enumerate(self.traces.series):
            hall = spec.hall_of.get(s.name, halls[i % len(halls)])
            price = s.prices[0] if s.prices else spot_default
            pool = Pool(
                region,
                hall,
                spec.flavor,
                CapacityClass.SPOT,
                spec.units_per_instance,
                price,
                aggregate=s.name,
                notice_s=self.config.notice_s,
                cold_start_s=self.config.cold_start_s + self.config.join_s,
            )
            self._add_pool(pool, price)
            self._series_of[pool.id] = i
            self._schedule_series(pool.id, i)
        for hall in sorted(set(halls) | set(spec.hall_of.values())):
            pool = Pool(
                region,
                hall,
                spec.flavor,
                CapacityClass.GUARANTEED,
                spec.units_per_instance,
                g_price,
                aggregate="guaranteed",
                cold_start_s=self.config.cold_start_s + self.config.join_s,
            )
            self._add_pool(pool, g_price)
            quota = self.config.guaranteed_quota_per_hall
            self._capacity[pool.id] = spec.guaranteed_quota_per_hall if quota is None else quota
        self._apply_due()

    # ------------------------------------------------------------ set-up

    def _add_pool(self, pool: Pool, price: float) -> None:
        self._pools[pool.id] = pool
        self._servers.add_pool(pool.id)
        self._price[pool.id] = price
        self._capacity[pool.id] = 0
        self._announced[pool.id] = []

    def _instances_for(self, value: int, binary: bool) -> int:
        if not binary:
            # A count trace at scale: each unit stands for `pool_size` instances when
            # one is given (the region spec's size is for 0/1 traces only).
            return value * (self.config.pool_size or 1)
        if value == 0:
            return 0
        if self.config.unlimited_binary:
            return UNLIMITED
        size = self.config.pool_size or self.traces.region.pool_size
        return size * value

    def _schedule_series(self, pool_id: PoolId, index: int) -> None:
        s = self.traces.series[index]
        binary = s.binary
        for t, v in _from(s.changes(), self.now):
            n = self._instances_for(v, binary)
            self._pending_capacity[(pool_id, t)] = n
            self._push(t, Kind.CAPACITY, pool_id)
            if self.config.notice_s > 0 and t > self.now:
                self._push(max(self.now, t - self.config.notice_s), Kind.NOTICE, f"{pool_id}@{t!r}")
        for t, p in _from(s.price_changes(), self.now):
            self._pending_price[(pool_id, t)] = p
            self._push(t, Kind.PRICE, pool_id)

    def _push(self, t: float, kind: Kind, key: str) -> None:
        self._timeline.push(t, kind, key)

    # ------------------------------------------------------------ clock

    def next_event_time(self) -> float | None:
        return self._timeline.next_time()

    def advance_to(self, t: float) -> None:
        """Apply every event due at or before `t`, then stand at `t`."""
        if t < self.now:
            raise ValueError(f"time runs forward: {t} < {self.now}")
        while (due := self._timeline.pop_due(t)) is not None:
            at, kind, key = due
            self.now = at
            self.events_applied += 1
            self._apply(kind, key)
        self.now = t

    def _apply_due(self) -> None:
        self.advance_to(self.now)

    def _apply(self, kind: Kind, key: str) -> None:
        if kind is Kind.CAPACITY:
            self._set_capacity(key)
        elif kind is Kind.NOTICE:
            pool_id, at = key.rsplit("@", 1)
            self._announce(pool_id, float(at))
        elif kind is Kind.PRICE:
            price = self._pending_price.pop((key, self.now))
            self._price[key] = price
            if self.observer:
                self.observer.price(self.now, key, price)
        else:
            server = self._servers.get(key)
            if server is not None:
                events = self.server_events
                events[server.partition] = events.get(server.partition, 0) + 1
                self._apply_server(kind, server)
            return
        if kind is Kind.PRICE:
            self.price_events += 1
        else:
            self.pool_events += 1

    def _apply_server(self, kind: Kind, s: Server) -> None:
        if kind is Kind.LISTED:
            s.listed = True
            self._servers.relist(s)
        elif kind is Kind.ACTIVE and not s.deleting:
            s.status = ServerStatus.ACTIVE
            s.active_at = self.now
            self._servers.relist(s)
            self._push(self.now + self.config.join_s, Kind.JOINED, s.server_id)
        elif kind is Kind.JOINED and not s.deleting and not s.draining:
            s.joined = True
            s.joined_at = self.now
            self._servers.renode(s)
            self._set_running(s, True)
        elif kind is Kind.DRAIN_START and not s.deleting:
            self._set_running(s, False)
        elif kind is Kind.DRAINED:
            s.drained = True
            self._servers.renode(s)
        elif kind is Kind.RECLAIM or kind is Kind.DELETED:
            self._remove(s)

    # ------------------------------------------------------------ capacity

    def _set_capacity(self, pool_id: PoolId) -> None:
        n = self._pending_capacity.pop((pool_id, self.now))
        self._capacity[pool_id] = n
        self._announced[pool_id] = [(t, v) for t, v in self._announced[pool_id] if t > self.now]
        if self.observer:
            self.observer.capacity(self.now, pool_id, n)
        alive = self._holding(pool_id)
        excess = len(alive) - n
        if excess > 0:
            # Unannounced reclaim of the newest; noticed ones go first, they are leaving anyway.
            victims = sorted(alive, key=lambda s: (s.notice_deadline is None, -s.created_at))
            for s in victims[:excess]:
                if s.notice_deadline is None and self.observer:
                    self.observer.reclaimed(
                        self.now, s.partition, pool_id, s.pool.units_per_instance, 0.0
                    )
                self._remove(s)

    def _announce(self, pool_id: PoolId, at: float) -> None:
        """Notice the servers that will not fit when capacity drops at `at`."""
        future = self._pending_capacity.get((pool_id, at))
        if future is None:
            return
        self._announced[pool_id].append((at, future))
        staying = [
            s for s in self._holding(pool_id) if s.notice_deadline is None or s.notice_deadline > at
        ]
        excess = len(staying) - future
        if excess <= 0:
            return
        fresh = sorted(
            (s for s in staying if s.notice_deadline is None), key=lambda s: -s.created_at
        )
        for s in fresh[:excess]:
            s.notice_deadline = at
            self._servers.relist(s)
            self._push(at, Kind.RECLAIM, s.server_id)
            if self.observer:
                self.observer.reclaimed(
                    self.now, s.partition, pool_id, s.pool.units_per_instance, at - self.now
                )

    def _holding(self, pool_id: PoolId) -> list[Server]:
        return self._servers.holding(pool_id)

    def _effective_capacity(self, pool_id: PoolId) -> int:
        """Capacity now, lowered by any drop already announced: it is not ours to give."""
        n = self._capacity[pool_id]
        for _, v in self._announced[pool_id]:
            n = min(n, v)
        return n

    # ------------------------------------------------------------ servers

    def _set_running(self, s: Server, running: bool) -> None:
        if s.running == running:
            return
        s.running = running
        if self.observer:
            u = s.pool.units_per_instance
            self.observer.running(
                self.now, s.partition, s.pool.id, u if running else -u, s.created_at
            )

    def _remove(self, s: Server) -> None:
        if s.server_id not in self._servers:
            return
        self._set_running(s, False)
        self._servers.remove(s)  # its token with it: its agent is gone too
        if self.observer:
            self.observer.held(self.now, s.pool.id, s.partition, -1)

    def _fault(self, call: str) -> None:
        if self.config.error_rate and self._rng.random() < self.config.error_rate:
            raise RetryableProviderError(f"simulated 503 on {call}")

    # ------------------------------------------------------------ Provider

    def pools(self) -> Sequence[Pool]:
        return list(self._pools.values())

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        room = self._room()
        return {p: room[p] for p in pools if p in room}

    def _room(self) -> dict[PoolId, int]:
        """Every pool's headroom, worked out again only once it moved (`room_moves`):
        every controller's cycle and every tick's signal jobs ask."""
        moved = self.room_moves()
        if moved != self._room_at:
            self._room_at = moved
            self._room_now = {
                p: max(0, self._effective_capacity(p) - self._servers.held_in(p))
                for p in self._pools
            }
        return self._room_now

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        return {p: self._price[p] for p in pools if p in self._price}

    def create(
        self,
        pool: PoolId,
        count: int,
        request_id: str,
        partition: str,
        plan_generation: int,
        installation: str = DEFAULT_INSTALLATION,
    ) -> CreateResult:
        # A wrong request, as the cloud answers one: no pool will ever have room for it.
        if pool not in self._pools:
            raise PermanentProviderError(f"no such pool {pool}")
        if count < 1:
            raise PermanentProviderError(f"a create of {count} servers")
        self._fault("create")
        timed_out = self.config.timeout_rate and self._rng.random() < self.config.timeout_rate
        if timed_out and self._rng.random() < 0.5:
            raise RetryableProviderError("simulated timeout on create (nothing created)")
        room = self.headroom([pool])[pool]
        if room <= 0:
            raise InsufficientCapacity(pool)
        n = min(count, room)
        ids = tuple(
            self._new_server(pool, partition, request_id, plan_generation, installation)
            for _ in range(n)
        )
        if self.observer:
            self.observer.created(self.now, partition, pool, n)
        if timed_out:
            raise RetryableProviderError("simulated timeout on create (servers were created)")
        short = f"only {n} of {count} fit in {pool}" if n < count else ""
        return CreateResult(ids, short)

    def _new_server(
        self, pool_id: PoolId, partition: str, request_id: str, gen: int, installation: str
    ) -> str:
        sid = f"srv-{next(self._ids):07d}"
        s = Server(sid, partition, self._pools[pool_id], request_id, gen, self.now)
        s.installation = installation
        self._servers.add(s)
        self._push(self.now + self.config.api_latency_s, Kind.LISTED, sid)
        self._push(self.now + self.config.cold_start_s, Kind.ACTIVE, sid)
        if self.observer:
            self.observer.held(self.now, pool_id, partition, 1)
        return sid

    def delete(self, server_ids: Sequence[str]) -> None:
        self._fault("delete")
        for sid in server_ids:
            s = self._servers.get(sid)
            if s is None or s.deleting:
                continue
            s.deleting = True
            self._set_running(s, False)
            self._push(self.now + self.config.delete_s, Kind.DELETED, sid)

    def list(
        self, partition: str, installation: str = DEFAULT_INSTALLATION
    ) -> Sequence[ServerView]:
        """The partition's servers of `installation` (others may share the region)."""
        self._fault("list")
        return self._servers.listed(partition, installation)

    def installation_of(self, server_id: str) -> str | None:
        s = self._servers.get(server_id)
        return s.installation if s is not None else None

    # ------------------------------------------------------------ inspection

    def report_capacities(self) -> None:
        """Tell the observer every pool's capacity now (after attaching it)."""
        if self.observer:
            for pool_id, n in self._capacity.items():
                self.observer.capacity(self.now, pool_id, n)

    def capacity_of(self, pool: PoolId) -> int:
        return self._capacity[pool]

    def held_in(self, pool: PoolId) -> int:
        return self._servers.held_in(pool)

    def server_count(self) -> int:
        return len(self._servers)

    def room_moves(self) -> tuple[int, int]:
        """Changes to the pools' room: capacity (and notices), and servers added or
        removed. While both are as before, every pool's headroom and holdings are."""
        return self.pool_events, self._servers.moves

    def is_deleting(self, server_id: str) -> bool:
        """Whether a delete was sent for the server."""
        s = self._servers.get(server_id)
        return s is not None and s.deleting

    # ------------------------------------------------------------ SchedulerCluster

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """Kept for the simulated server's agent (`node_token`)."""
        self._node_side.deliver_token(server_id, token)

    def node_token(self, server_id: str) -> Secret | None:
        return self._node_side.node_token(server_id)

    def lose_token(self, server_id: str) -> None:
        """A fault: another write to the server's metadata took its token."""
        self._node_side.lose_token(server_id)

    def nodes(
        self, partition: str, installation: str = DEFAULT_INSTALLATION
    ) -> Mapping[str, NodeView]:
        return self._node_side.nodes(partition, installation)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """Nothing keeps time on a simulated node's side: its drain is scheduled."""

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """The node starts leaving in time to be out by `drain_by`, serving until then;
        told again with a sooner deadline, it leaves by that one."""
        self._node_side.drain(partition, server_id, drain_by, reason, self.now, self.config.drain_s)

    def is_draining(self, server_id: str) -> bool:
        """Whether the server's node was told to leave."""
        return self._node_side.is_draining(server_id)

    def reclaim_told_at(self, server_id: str) -> float | None:
        """When the server's node was first told to leave for a reclaim (kept after the
        server is gone)."""
        return self._node_side.reclaim_told_at(server_id)

    @property
    def reclaims_told(self) -> Mapping[str, float]:
        """Server -> when its node was first told to leave for a reclaim."""
        return self._node_side.reclaims_told

    # ------------------------------------------------------------ the reclaimer's side

    def all_servers(self) -> Sequence[ServerView]:
        """Every listed server, of every partition (what a reclaimer chooses from)."""
        return self._reclaimer_side.all_servers()

    def give_notice(self, server_id: str, deadline: float) -> float:
        """The reclaim-notice contract: the server goes at `deadline`, or at the sooner
        deadline it was given before; returns the deadline in force."""
        return self._reclaimer_side.give_notice(server_id, deadline, self.now, self.observer)
