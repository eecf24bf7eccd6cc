"""Ports: the narrow interfaces the engine needs from the outside world, by role
(provider, scheduler, fleet state, event log, leases, secrets).

Each adapter package implements some of these; the controller knows only these.
Errors are typed by what the caller should do next.
"""

from __future__ import annotations

from sco.ports.events import (
    EventLog,
    LogRecord,
)
from sco.ports.leases import (
    Lease,
    LeaseManager,
)
from sco.ports.provider import (
    Clock,
    CreateResult,
    InsufficientCapacity,
    PermanentProviderError,
    Provider,
    ProviderError,
    QuotaExceeded,
    RetryableProviderError,
    ServerStatus,
    ServerView,
)
from sco.ports.scheduler import (
    DemandSource,
    NodeView,
    SchedulerCluster,
    SchedulerUnavailable,
)
from sco.ports.secrets import (
    AckReader,
    Credential,
    Secret,
    SecretSource,
    TokenCourier,
    TokenLedger,
)
from sco.ports.state import (
    FencedOut,
    FleetCounts,
    FleetStore,
    HistoryRow,
    InstanceStore,
    IntentStore,
    NewRequest,
    Outbox,
    PlanStore,
    PoolRecord,
    Reservation,
    SignalStore,
    StateConflict,
)

__all__ = [
    "AckReader",
    "Clock",
    "CreateResult",
    "Credential",
    "DemandSource",
    "EventLog",
    "FencedOut",
    "FleetCounts",
    "FleetStore",
    "HistoryRow",
    "InstanceStore",
    "InsufficientCapacity",
    "IntentStore",
    "Lease",
    "LeaseManager",
    "LogRecord",
    "NewRequest",
    "NodeView",
    "Outbox",
    "PermanentProviderError",
    "PlanStore",
    "PoolRecord",
    "Provider",
    "ProviderError",
    "QuotaExceeded",
    "Reservation",
    "RetryableProviderError",
    "SchedulerCluster",
    "SchedulerUnavailable",
    "Secret",
    "SecretSource",
    "ServerStatus",
    "ServerView",
    "SignalStore",
    "StateConflict",
    "TokenCourier",
    "TokenLedger",
]
