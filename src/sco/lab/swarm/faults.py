"""Faults at every port: the provider, fleet state, leases and the schedulers, as the
seed's schedule says, and what the invariants must know of each action taken.

Each replica gets its own wrappers, so every action is known by who took it: a
replica that learned it was fenced out must take none after.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sco.domain.pools import Pool, PoolId
from sco.lab.swarm.spec import Fault, Kind
from sco.lab.swarm.typos import Typos
from sco.ports import (
    CreateResult,
    FencedOut,
    FleetStore,
    InsufficientCapacity,
    Lease,
    LeaseStore,
    NodeView,
    RetryableProviderError,
    SchedulerCluster,
    ServerView,
    StateConflict,
)


class Killed(BaseException):
    """The replica dies here, between two writes: nothing of sco's may catch it."""


class DatabaseDown(Exception):
    """Fleet state cannot be reached."""


class LeaseApiDown(Exception):
    """Kubernetes' API cannot be reached for Leases."""


class EventLogDown(Exception):
    """The event log (Kafka, or its table) cannot be reached."""


class HistoryDown(Exception):
    """The history store (chDB, ClickHouse) cannot be reached."""


@dataclass
class Schedule:
    """The seed's faults, on the swarm's clock."""

    faults: tuple[Fault, ...]
    start_s: float
    now: Callable[[], float]
    writes: dict[str, int] = field(default_factory=dict)  # replica -> writes made
    fired: set[int] = field(default_factory=set)  # faults that happen once, done
    # kind -> times a fault changed what happened (a call refused, slowed or lost, a
    # replica paused or killed, a notice given): scheduled is not the same as effective
    effects: Counter[str] = field(default_factory=Counter)

    def hit(self, kind: Kind, target: str = "") -> Fault | None:
        """`active`, for a caller that acts on the answer: a fault found took effect."""
        f = self.active(kind, target)
        if f is not None:
            self.effects[str(kind)] += 1
        return f

    def took(self, kind: Kind, times: int = 1) -> None:
        self.effects[str(kind)] += times

    def active(self, kind: Kind, target: str = "") -> Fault | None:
        t = self.now() - self.start_s
        for f in self.faults:
            if f.kind is kind and f.active(t) and (not target or f.target in ("", target)):
                return f
        return None

    def any_active(self, t_s: float) -> bool:
        return any(f.duration_s > 0 and f.active(t_s) for f in self.faults)

    def once(self, kind: Kind, target: str = "") -> Fault | None:
        """The next fault of `kind` (for `target`) due and not yet done, marked done."""
        t = self.now() - self.start_s
        for k, f in enumerate(self.faults):
            if f.kind is kind and k not in self.fired and f.at_s <= t:
                if target and f.target != target:
                    continue
                if f.duration_s and not f.active(t):
                    continue
                self.fired.add(k)
                return f
        return None


class Stage(Protocol):
    """What the wrappers need of the running swarm."""

    schedule: Schedule
    typos: Typos  # servers whose notice was mistyped

    def now(self) -> float: ...

    def slow(self, seconds: float) -> None:
        """A call that takes `seconds`: the world moves on meanwhile."""
        ...

    def acted(self, replica: str, partition: str, what: str, detail: str) -> None:
        """A cloud or scheduler action by `replica`'s controller of `partition`."""
        ...

    def created(self, request_id: str, partition: str, installation: str) -> None: ...

    def sending(self, replica: str, installation: str, partition: str, request_id: str) -> None:
        """`replica` sends a create now (perhaps from its workers' queue)."""
        ...

    def asked_to_delete(self, installation: str, server_ids: Sequence[str]) -> None:
        """`installation` sent these servers' delete (whether the cloud took it or not):
        they are leaving."""
        ...

    def touched(self, installation: str, server_ids: Sequence[str], what: str) -> None:
        """`installation` acts on these servers: they must be its own."""
        ...

    def refused_write(self, replica: str, partition: str) -> None:
        """The database refused a write for a stale fence."""
        ...

    def takeover(self, victim: str, partition: str) -> None:
        """Another replica takes `partition` over now, while `victim` is mid-cycle."""
        ...


class CloudFaults:
    """The provider (and static node plane) one replica sees."""

    def __init__(self, inner: Any, stage: Stage, replica: str) -> None:
        self.inner = inner
        self.stage = stage
        self.replica = replica
        self.partition = ""  # the partition whose cycle runs now (the driver sets it)
        self.last: dict[str, tuple[ServerView, ...]] = {}  # the last listing of each

    def _call(self, what: str) -> None:
        s = self.stage.schedule
        if s.hit(Kind.CREDENTIAL_EXPIRED):
            raise RetryableProviderError(f"{what}: the credential expired (OpenBao away)")
        slow = s.hit(Kind.SLOW_CLOUD)
        if slow is not None:
            self.stage.slow(slow.value)
        if self.partition and s.once(Kind.TAKEOVER_MID_CYCLE, self.partition) is not None:
            self.stage.takeover(self.replica, self.partition)

    def pools(self) -> Sequence[Pool]:
        pools = list(self.inner.pools())
        gone = self.stage.schedule.active(Kind.POOL_MISSING)
        if gone is None or not any(p.aggregate == gone.target for p in pools):
            return pools
        self.stage.schedule.took(Kind.POOL_MISSING)
        return [p for p in pools if p.aggregate != gone.target]

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        if self.stage.schedule.hit(Kind.HEADROOM_STALE):
            # What the OpenStack adapter answers when placement's summaries are older
            # than `headroom_stale_s`: no room it can vouch for, anywhere.
            return dict.fromkeys(pools, 0)
        return dict(self.inner.headroom(pools))

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        prices = dict(self.inner.prices(pools))
        shift = self.stage.schedule.active(Kind.PRICE_SHIFT)
        moved = [p for p in prices if shift is not None and p.split("/")[1] == shift.target]
        if shift is None or not moved:
            return prices
        self.stage.schedule.took(Kind.PRICE_SHIFT)
        return {p: v * shift.value if p in moved else v for p, v in prices.items()}

    def list(self, partition: str) -> Sequence[ServerView]:
        self._call("list")
        if self.stage.schedule.hit(Kind.LIST_ERROR):
            raise RetryableProviderError("list: 503 from Nova")
        views = self.last[partition] = self.stage.typos.listed(self.inner.list(partition))
        return views

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        self._call("create")
        s = self.stage.schedule
        if s.hit(Kind.CREATE_ERROR):
            raise RetryableProviderError("create: 503 from Nova (nothing created)")
        if s.hit(Kind.CREATE_REFUSED):
            raise InsufficientCapacity(pool, f"no room in {pool} (the cloud says)")
        self.stage.acted(self.replica, partition, "create", f"{count} in {pool} ({request_id})")
        self.stage.sending(self.replica, self.inner.installation, partition, request_id)
        self.stage.created(request_id, partition, self.inner.installation)
        result: CreateResult = self.inner.create(
            pool, count, request_id, partition, plan_generation
        )
        if s.hit(Kind.CREATE_TIMEOUT):
            raise RetryableProviderError("create: timed out (it took effect)")
        return result

    def delete(self, server_ids: Sequence[str]) -> None:
        self._call("delete")
        self.stage.asked_to_delete(self.inner.installation, server_ids)
        if self.stage.schedule.hit(Kind.DELETE_ERROR):
            raise RetryableProviderError("delete: 503 from Nova")
        self.stage.acted(self.replica, self.partition, "delete", ",".join(server_ids))
        self.stage.touched(self.inner.installation, server_ids, "delete")
        self.inner.delete(server_ids)

    # The static partitions' node plane: each server is its node.

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return dict(self.inner.nodes(partition))

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.inner.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.stage.acted(self.replica, partition, "drain", f"{server_id} by {drain_by:.0f}")
        self.stage.touched(self.inner.installation, [server_id], "drain")
        self.inner.drain(partition, server_id, drain_by, reason)


class NodeFaults:
    """A replica's node plane: every tend and drain is known by who did it."""

    def __init__(self, inner: SchedulerCluster, stage: Stage, replica: str) -> None:
        self.inner = inner
        self.stage = stage
        self.replica = replica
        self.tends: list[tuple[str, float]] = []  # (partition, when) of each tend called

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return self.inner.nodes(partition)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.stage.acted(self.replica, partition, "tend", "")
        self.tends.append((partition, self.stage.now()))
        self.inner.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.stage.acted(self.replica, partition, "drain", f"{server_id} {reason}")
        self.stage.typos.drained(server_id, reason)
        self.inner.drain(partition, server_id, drain_by, reason)


_WRITES = ("record", "reserve", "save_plan", "settle_reservation", "emit", "put_exclusion")
_READS = (
    "pools",
    "instances",
    "pool_records",
    "reservations",
    "latest_plan",
    "exclusions",
    "latest_scores",
    "signal_stamp",
    "reclaims_since",
    "pool_ages",
    "intents",
    "live_per_pool",
    "sweep_reservations",
    "set_pool_age",
)
# What passes through untouched (the swarm's own reads, and what no fault reaches).
_PASSED = (
    "upsert_pools",
    "history",
    "counts",
    "relay_outbox",
    "outbox_size",
    "save_scores",
    "put_intent",
    "drop_intent",
)


class StoreFaults:
    """Fleet state as one replica reaches it: a database outage, lost compare-and-swaps,
    the replica's death between two writes, and every refused fence, told. Over any
    fleet state: a database of the replica's own connection, or the in-memory twin
    every replica shares."""

    lost_races = 0  # writes the swarm's conflicts refused

    def __init__(self, inner: FleetStore, stage: Stage, replica: str) -> None:
        self.inner = inner
        self.stage = stage
        self.replica = replica

    def _reach(self) -> None:
        if self.stage.schedule.hit(Kind.DATABASE_DOWN):
            raise DatabaseDown("could not connect to the database")

    def before_write(self) -> int:
        """Count the replica's write; it may die here. Returns the write's number."""
        s = self.stage.schedule
        n = s.writes[self.replica] = s.writes.get(self.replica, 0) + 1
        kill = s.active(Kind.KILL, self.replica)
        if kill is not None and n >= kill.value and s.once(Kind.KILL, self.replica):
            s.took(Kind.KILL)
            raise Killed(f"{self.replica} killed before write {n}")
        return n

    def _write(self, partition: str) -> None:
        s = self.stage.schedule
        n = self.before_write()
        race = s.active(Kind.STORE_CONFLICT, self.replica)
        # While it lasts, each write loses its compare-and-swap with the fault's odds
        # (drawn from the write's number: a replay loses the same ones).
        if race is not None and random.Random(f"{race.at_s}/{n}").random() < race.value:
            self.lost_races += 1
            s.took(Kind.STORE_CONFLICT)
            raise StateConflict(f"{partition}: a row moved (the swarm's conflict)")


def _reading(name: str) -> Callable[..., Any]:
    def call(self: StoreFaults, *args: Any, **kwargs: Any) -> Any:
        self._reach()
        return getattr(self.inner, name)(*args, **kwargs)

    return call


def _writing(name: str) -> Callable[..., Any]:
    def call(self: StoreFaults, *args: Any, **kwargs: Any) -> Any:
        self._reach()
        self._write(_partition_of(args))
        try:
            return getattr(self.inner, name)(*args, **kwargs)
        except FencedOut:
            self.stage.refused_write(self.replica, _partition_of(args))
            raise

    return call


def _passing(name: str) -> Callable[..., Any]:
    def call(self: StoreFaults, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    return call


def _partition_of(args: Sequence[Any]) -> str:
    """The partition a write is for: of its changes, its request, its plan or events."""
    first = args[0] if args else None
    if isinstance(first, list | tuple):
        first = first[0] if first else None
    first = getattr(first, "after", first)
    first = getattr(first, "reservation", first)
    return str(getattr(first, "partition", ""))


for _name in _READS:
    setattr(StoreFaults, _name, _reading(_name))
for _name in _WRITES:
    setattr(StoreFaults, _name, _writing(_name))
for _name in _PASSED:
    setattr(StoreFaults, _name, _passing(_name))


def faulty(store: FleetStore, stage: Stage, replica: str) -> tuple[FleetStore, StoreFaults]:
    """`store` as `replica` reaches it, typed as the port (the wrapper's methods are
    made above, one per method of the port), and the wrapper for what it counts."""
    wrapper = StoreFaults(store, stage, replica)
    return cast(FleetStore, wrapper), wrapper


class LeaseFaults:
    """Leases as a replica reaches them: kept in fleet state, an outage reaches them too;
    fencing is always fleet state's."""

    def __init__(self, inner: LeaseStore, stage: Stage, in_database: bool) -> None:
        self.inner = inner
        self.stage = stage
        self.in_database = in_database

    def _reach(self) -> None:
        if self.in_database:
            self._reach_database()
        elif self.stage.schedule.hit(Kind.LEASE_API_DOWN):
            raise LeaseApiDown("the Kubernetes API answered 503 to a Lease call")

    def _reach_database(self) -> None:
        if self.stage.schedule.hit(Kind.DATABASE_DOWN):
            raise DatabaseDown("could not connect to the database")

    def claim_fence(
        self, partition: str, holder: str, token: int, until: float, now: float
    ) -> int | None:
        self._reach_database()
        return self.inner.claim_fence(partition, holder, token, until, now)

    def release_fence(self, partition: str, holder: str) -> None:
        self._reach_database()
        self.inner.release_fence(partition, holder)

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        self._reach()
        return self.inner.acquire(partition, holder, ttl_s, now)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        self._reach()
        return self.inner.renew(lease, ttl_s, now)

    def release(self, lease: Lease) -> None:
        self._reach()
        self.inner.release(lease)

    def leases(self) -> list[Lease]:
        self._reach()
        return list(self.inner.leases())

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        self._reach()
        self.inner.heartbeat(name, ttl_s, now)

    def live_replicas(self, now: float) -> list[str]:
        self._reach()
        return list(self.inner.live_replicas(now))

    def forget_replica(self, name: str) -> None:
        self._reach()
        self.inner.forget_replica(name)


class HistoryFaults:
    """The scorer's history as it reaches it: away while `history_down` lasts."""

    def __init__(self, inner: Any, schedule: Schedule) -> None:
        self.inner = inner
        self.schedule = schedule

    def _reach(self) -> None:
        if self.schedule.hit(Kind.HISTORY_DOWN):
            raise HistoryDown("the history store refused the connection")

    def load(self, events: Sequence[Any]) -> int:
        self._reach()
        return int(self.inner.load(events))

    def pool_stats(self, now: float, window_s: float) -> Any:
        self._reach()
        return self.inner.pool_stats(now, window_s)


class EventsFaults:
    """The event log as the relay, the watcher and the history loader reach it: away
    while `events_down` lasts."""

    def __init__(self, inner: Any, schedule: Schedule) -> None:
        self.inner = inner
        self.schedule = schedule

    def _reach(self) -> None:
        if self.schedule.hit(Kind.EVENTS_DOWN):
            raise EventLogDown("the event log's brokers are unreachable")

    def absorb_outbox(self) -> int:
        self._reach()
        return int(self.inner.absorb_outbox())

    def append(self, events: Sequence[Any]) -> None:
        self._reach()
        self.inner.append(events)

    def read(self, consumer: str, limit: int) -> Any:
        self._reach()
        return self.inner.read(consumer, limit)

    def commit(self, consumer: str, offset: int) -> None:
        self._reach()
        self.inner.commit(consumer, offset)

    def dead_letter(self, consumer: str, record: Any, error: str) -> None:
        self._reach()
        self.inner.dead_letter(consumer, record, error)
