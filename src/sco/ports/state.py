"""Fleet state, by role: instances and reservations, plans, signals, intents and the
outbox; a `FleetStore` is all of them. Writes are compare-and-swap; a lost one raises
`StateConflict` (reload and retry). A partition's records, reservations and plans
are written with the fencing token of its leader's lease (`fence`); one made with a
stale token raises `FencedOut` (`sco.ports.leases`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sco.domain.events import LifecycleEvent
from sco.domain.instances import Change, Instance
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, PoolScore


class StateConflict(Exception):
    """A compare-and-swap lost: someone else changed the row. Reload and retry."""


class FencedOut(StateConflict):
    """The database refused a write made with a stale fencing token: another
    controller holds the partition's lease now. Stop acting on the partition."""


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
    code: str | None = None  # an action's reason code (replace_reclaimed, node_drained...)


@dataclass(frozen=True, slots=True)
class FleetCounts:
    instances_by_state: Mapping[str, int] = field(default_factory=dict)
    history_rows: int = 0
    plans: int = 0
    reservations: int = 0


class InstanceStore(Protocol):
    """Instance records and the reservations that precede their creates."""

    def upsert_pools(self, pools: Sequence[Pool]) -> None: ...

    def pools(self) -> list[Pool]:
        """Every pool ever upserted, those discovery no longer lists too."""
        ...

    def pool_records(self) -> Mapping[PoolId, PoolRecord]:
        """Pools with their CAS version and pending reservation counts."""
        ...

    def instances(self, partition: str) -> list[Instance]:
        """Non-terminal records of `partition`."""
        ...

    def record(
        self, changes: Sequence[Change], settle: Mapping[str, int] | None = None, fence: int = 0
    ) -> None:
        """Persist changes with compare-and-swap and one history row each, atomically,
        with reservations settled (request id -> count still pending) in the same transaction,
        and the event of each change in the outbox.

        Raises StateConflict if any record's version moved, or one is created twice;
        FencedOut if `fence` is below its partition's fencing token. Nothing is written
        then.
        """
        ...

    def reserve(self, request: NewRequest, fence: int = 0) -> None:
        """Write a reservation and its REQUESTED records, if the pool's version still matches.

        Raises StateConflict when another writer reserved in the pool meanwhile,
        FencedOut as `record` does.
        """
        ...

    def settle_reservation(self, request_id: str, count: int) -> None:
        """Shrink a reservation to `count` (servers accepted but not yet observed); 0 drops it."""
        ...

    def reservations(self) -> list[Reservation]: ...

    def sweep_reservations(self, now: float) -> int:
        """Drop expired reservations; returns how many."""
        ...

    def history(self, instance_id: str | None = None) -> list[HistoryRow]: ...

    def counts(self) -> FleetCounts: ...


class PlanStore(Protocol):
    """Plan generations, one writer per partition."""

    def latest_plan(self, partition: str) -> Plan | None: ...

    def save_plan(self, plan: Plan, fence: int = 0) -> None:
        """Store a new generation; raises StateConflict if that generation exists,
        FencedOut as `InstanceStore.record` does."""
        ...


class Outbox(Protocol):
    """The transactional outbox: events written with the changes that cause them."""

    def emit(self, events: Sequence[LifecycleEvent]) -> None:
        """Put events with no state change of their own (pool signals) in the outbox;
        an event id already there is skipped."""
        ...

    def relay_outbox(self, append: Callable[[list[LifecycleEvent]], None], limit: int) -> int:
        """Hand the oldest outbox events to `append`, then drop them, atomically with
        respect to other relays; returns how many."""
        ...

    def outbox_size(self) -> int: ...


class SignalStore(Protocol):
    """The pools' signals every controller reads: exclusions, scores, ages, reclaims."""

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

    def pool_ages(self) -> dict[PoolId, float | None]: ...

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool:
        """Set it only if that changes whether the pool has capacity; True if written."""
        ...

    def live_per_pool(self) -> dict[PoolId, int]: ...


class PoolAgeStore(Protocol):
    def pool_ages(self) -> dict[PoolId, float | None]: ...

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool: ...


class IntentStore(Protocol):
    """What operators ask of partitions: one intent each."""

    def intents(self) -> dict[str, str]: ...

    def put_intent(self, partition: str, intent: str, at: float, by: str) -> None: ...

    def drop_intent(self, partition: str) -> bool: ...


class FleetReads(Protocol):
    """What operators read of fleet state (`sco status`, `sco explain`, `sco slurm
    usage`), never the control plane."""

    def partitions(self) -> list[str]:
        """Every partition with instances or a plan."""
        ...

    def history_since(self, since: float) -> list[HistoryRow]:
        """Every transition at or after `since`, oldest first."""
        ...

    def recent_history(self, limit: int) -> list[HistoryRow]:
        """The last `limit` transitions, newest first."""
        ...

    def server_ids(self, instance_ids: Iterable[str]) -> dict[str, str]:
        """The server of each instance that had one (gone ones included)."""
        ...

    def server_classes(self, partition: str) -> dict[str, str]:
        """Capacity class by server id of every server the partition ever had."""
        ...


class FleetAudit(Protocol):
    """Fleet state's rows as they stand, for an auditor (the swarm's invariant checks),
    not for the control plane: every instance record's server and state, gone ones
    included. Every transition in the order written is `InstanceStore.history()`."""

    def history(self, instance_id: str | None = None) -> list[HistoryRow]: ...

    def lives(self) -> list[tuple[str, str | None, str]]:
        """(instance, server id, state) of every instance record."""
        ...

    def state_of_server(self, server_id: str) -> str | None:
        """The state of the record that names `server_id`, if one does."""
        ...


class FleetStore(InstanceStore, PlanStore, Outbox, SignalStore, IntentStore, Protocol):
    """All of fleet state: what a store that keeps every role in one place (one
    database, one process) offers."""
