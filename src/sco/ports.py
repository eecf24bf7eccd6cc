"""Ports: the narrow interfaces the runtime needs from the outside world.

Each adapter package implements some of these; the controller knows only
these. Errors are typed by what the caller should do next.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol

from sco.domain.demand import Demand, Partition
from sco.domain.events import LifecycleEvent
from sco.domain.instances import Change, Instance
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, PoolScore

# ---------------------------------------------------------------- errors


class ProviderError(Exception):
    """Base of everything a provider raises."""


class InsufficientCapacity(ProviderError):
    """The pool has no room now: try another pool; this one may recover."""

    def __init__(self, pool: PoolId, message: str = "") -> None:
        super().__init__(message or f"insufficient capacity in {pool}")
        self.pool = pool


class QuotaExceeded(ProviderError):
    """A quota would be exceeded: nothing will fit until something is released."""


class RetryableProviderError(ProviderError):
    """A transient failure (5xx, timeout): the same call may succeed later.

    After a timeout the call may or may not have taken effect; tags make the
    outcome observable on the next list.
    """


class PermanentProviderError(ProviderError):
    """The request is wrong (bad flavor, bad credential): retrying will not help."""


class SchedulerUnavailable(Exception):
    """A scheduler cluster (its demand or its nodes) cannot be read now: the partition is
    degraded and acts on nothing until it can."""


class StateConflict(Exception):
    """A compare-and-swap lost: someone else changed the row. Reload and retry."""


class FencedOut(StateConflict):
    """The database refused a write made with a stale fencing token: another
    controller holds the partition's lease now. Stop acting on the partition."""


# ---------------------------------------------------------------- time


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch of this clock."""
        ...


# ---------------------------------------------------------------- provider


class ServerStatus(StrEnum):
    BUILD = "build"
    ACTIVE = "active"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class ServerView:
    """A server as the provider lists it, with the tags sco put on it."""

    server_id: str
    partition: str
    pool: PoolId
    request_id: str
    plan_generation: int
    status: ServerStatus
    created_at: float
    notice_deadline: float | None = None  # set when the provider announced a reclaim
    # the notice as set when it is not a time (notice_deadline is then 0: leave now)
    notice_unreadable: str = ""
    fault: str = ""
    active_at: float | None = None  # when it became ACTIVE, by the provider's own clock
    refused: bool = False  # the provider could not place it (no valid host): it never ran


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What became of a create: servers accepted now (fewer than asked when the pool ran
    short), or `pending` servers the provider took and will list by request id (the
    caller records them as it sees them; refused ones are listed with `refused`)."""

    server_ids: tuple[str, ...]
    shortfall_reason: str = ""
    pending: int = 0


class Provider(Protocol):
    def pools(self) -> Sequence[Pool]:
        """Every pool this provider offers."""
        ...

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        """How many more instances of each pool fit now (>= 0)."""
        ...

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        """Current price per instance-hour of each pool."""
        ...

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        """Create up to `count` servers in `pool`, tagged for adoption.

        Accepts part of a batch when the pool is short, or takes the request and
        answers later through listings (`CreateResult.pending`). Raises
        InsufficientCapacity when none fit, QuotaExceeded, RetryableProviderError
        (the outcome is unknown; list to find out) or PermanentProviderError.
        """
        ...

    def delete(self, server_ids: Sequence[str]) -> None:
        """Delete servers; deleting one already gone is not an error."""
        ...

    def list(self, partition: str) -> Sequence[ServerView]:
        """Servers tagged with `partition`, as they are now."""
        ...


@dataclass(frozen=True, slots=True)
class NodeView:
    joined: bool
    drained: bool
    joined_at: float | None = None  # when it joined, by the scheduler's (or provider's) clock
    busy: bool = False  # work runs there: the last to go when the partition shrinks
    pinned: bool = False  # runs work sco's own moves must not disrupt: only a reclaim takes it
    note: str = ""  # what the scheduler says its leaving cuts short: goes into the event
    # Whether the scheduler holds sco's order to leave (a DRAIN, a cordon); None when the
    # plane cannot tell (its order travels another way, as an agent's contract does).
    leaving: bool | None = None
    reclaim_by: float | None = None  # the reclaim deadline the scheduler holds, if any


class SchedulerCluster(Protocol):
    """The node plane as the controller sees it: membership, draining, and the work at a
    reclaim's deadline that the scheduler side does."""

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        """Node state by server id. Reads only: nothing changes in the scheduler (a dry
        run calls it on real schedulers)."""
        ...

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """The scheduler side's own work, which keeps time whether or not the cloud
        answers: requeue or evict a reclaim's work before its deadline, take its node
        out at the deadline. Given this cycle's listing (`servers`), also what depends
        on it: forget the nodes of servers that are gone, label new ones. None: the
        cloud could not be listed, and nothing is done that a listing must justify.
        Raises SchedulerUnavailable when the scheduler cannot be reached."""
        ...

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """Tell a node to leave its scheduler by `drain_by`. `reason` is the action's
        reason code: a `reclaim_notice` drain may cut work short to leave in time; any
        other (sco's own moves) only drains, and never cuts work short. Telling a node
        again, with a sooner deadline or a reclaim, replaces what it was told."""
        ...


# ---------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class Lease:
    """Who may act on a partition until when; `token` grows with every new holder
    and fences the holder's writes."""

    partition: str
    holder: str
    token: int
    expires_at: float


class LeaseManager(Protocol):
    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        """Take the partition's lease if it is free or expired (a new, larger token),
        or extend it if `holder` has it; None when someone else holds it."""
        ...

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        """Extend a held lease; None when it was lost (expired and taken, or gone)."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up now, if still held."""
        ...

    def leases(self) -> list[Lease]: ...


# ---------------------------------------------------------------- credentials


class Secret:
    """A secret value that does not print: repr, str and format show stars."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value, for the one call that must send it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not pickled")


@dataclass(frozen=True, slots=True)
class Credential:
    """Authentication fields for a provider (keystone `auth` keys), and until when
    they may be used. Empty fields: the provider's own configuration holds them."""

    fields: Mapping[str, Secret] = field(default_factory=dict)
    expires_at: float | None = None
    source: str = ""

    def revealed(self) -> dict[str, str]:
        return {k: v.reveal() for k, v in self.fields.items()}


class SecretSource(Protocol):
    def credential(self) -> Credential:
        """A credential valid now; the caller asks again before `expires_at`."""
        ...


# ---------------------------------------------------------------- node tokens


class TokenCourier(Protocol):
    """Hands a node its token through its server (metadata the node can read)."""

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """Raises ProviderError when the server could not be given it."""
        ...


class TokenLedger(Protocol):
    """Where node tokens are kept (as digests) with their contracts."""

    def untokened(self, partition: str, renew_before: float) -> list[tuple[str, str]]:
        """(instance id, server id) of live contracts with no token, or one that
        expires before `renew_before`."""
        ...

    def set_token(self, instance_id: str, token_hash: str, expires_at: float) -> bool: ...


class AckReader(Protocol):
    def drained_servers(self, partition: str) -> set[str]:
        """Servers whose agent said its node is out of its scheduler (drained or
        left), answering the contract version that told it to leave."""
        ...


# ---------------------------------------------------------------- demand


class DemandSource(Protocol):
    def partitions(self) -> Sequence[Partition]: ...

    def demand(self, partition: str, now: float) -> Demand: ...

    def next_change_after(self, now: float) -> float | None:
        """When some partition's demand next changes, if known (simulation uses it)."""
        ...


# ---------------------------------------------------------------- fleet state


@dataclass(frozen=True, slots=True)
class Reservation:
    request_id: str
    pool: PoolId
    partition: str
    count: int
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """A pool row's compare-and-swap version and its pending reservations."""

    version: int
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A create about to be sent: its reservation and the records it will fill."""

    reservation: Reservation
    instances: tuple[Instance, ...]
    pool_version: int


@dataclass(frozen=True, slots=True)
class HistoryRow:
    instance_id: str
    partition: str
    pool: PoolId
    at: float
    from_state: str | None
    to_state: str
    trigger: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class FleetCounts:
    instances_by_state: Mapping[str, int] = field(default_factory=dict)
    history_rows: int = 0
    plans: int = 0
    reservations: int = 0


class FleetStore(Protocol):
    def upsert_pools(self, pools: Sequence[Pool]) -> None: ...

    def pool_records(self) -> Mapping[PoolId, PoolRecord]:
        """Pools with their CAS version and pending reservation counts."""
        ...

    def instances(self, partition: str) -> list[Instance]:
        """Non-terminal records of `partition`."""
        ...

    def record(self, changes: Sequence[Change], settle: Mapping[str, int] | None = None) -> None:
        """Persist changes with compare-and-swap and one history row each, atomically,
        with reservations settled (request id -> count still pending) in the same transaction.

        Raises StateConflict if any record's version moved; nothing is written then.
        """
        ...

    def reserve(self, request: NewRequest) -> None:
        """Write a reservation and its REQUESTED records, if the pool's version still matches.

        Raises StateConflict when another writer reserved in the pool meanwhile.
        """
        ...

    def settle_reservation(self, request_id: str, count: int) -> None:
        """Shrink a reservation to `count` (servers accepted but not yet observed); 0 drops it."""
        ...

    def reservations(self) -> list[Reservation]: ...

    def sweep_reservations(self, now: float) -> int:
        """Drop expired reservations; returns how many."""
        ...

    def latest_plan(self, partition: str) -> Plan | None: ...

    def save_plan(self, plan: Plan) -> None:
        """Store a new generation; raises StateConflict if that generation exists."""
        ...

    def history(self, instance_id: str | None = None) -> list[HistoryRow]: ...

    def counts(self) -> FleetCounts: ...

    # --- the transactional outbox: events written with the changes that cause them

    def emit(self, events: Sequence[LifecycleEvent]) -> None:
        """Put events with no state change of their own (pool signals) in the outbox;
        an event id already there is skipped."""
        ...

    def relay_outbox(self, append: Callable[[list[LifecycleEvent]], None], limit: int) -> int:
        """Hand the oldest outbox events to `append`, then drop them, atomically with
        respect to other relays; returns how many."""
        ...

    def outbox_size(self) -> int: ...

    # --- signals shared by every controller

    def exclusions(self) -> dict[PoolId, Exclusion]: ...

    def put_exclusion(self, exclusion: Exclusion, event: LifecycleEvent) -> Exclusion:
        """Write an exclusion if its version is still current (CAS), with its event.

        Returns it with the version bumped; raises StateConflict otherwise.
        """
        ...

    def save_scores(self, scores: Sequence[PoolScore], keep: int = 288) -> int:
        """Store one generation of scores and keep only the last `keep`; returns its
        number."""
        ...

    def latest_scores(self) -> dict[PoolId, PoolScore]: ...

    def signal_stamp(self) -> tuple[int, int, float, int]:
        """Moves when an exclusion, a score generation, a pool age or an intent is
        written: (exclusions' versions, latest score generation, ages digest, intents
        digest)."""
        ...

    def reclaims_since(self, since: float) -> list[tuple[PoolId, str, float]]:
        """(pool, instance, at) of the reclaims recorded at or after `since`."""
        ...

    # --- pool ages: since when each pool has had capacity

    def pool_ages(self) -> dict[PoolId, float | None]: ...

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool:
        """Set it only if that changes whether the pool has capacity; True if written."""
        ...

    def live_per_pool(self) -> dict[PoolId, int]: ...

    # --- what operators ask of partitions

    def intents(self) -> dict[str, str]: ...

    def put_intent(self, partition: str, intent: str, at: float, by: str) -> None: ...

    def drop_intent(self, partition: str) -> bool: ...


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
