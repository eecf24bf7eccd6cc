"""Ports: the narrow interfaces the engine needs from the outside world, by role:
the cloud (`provider`), the schedulers (`scheduler`), fleet state (`state`), the
event log (`events`), leases with membership and fencing (`leases`), node
contracts and their tokens (`contracts`), pool history (`history`), the
reclaimer's view of the cloud (`reclaim`) and secrets (`secrets`).

Each adapter package implements some of these, each lab twin the same ones, and
`tests/conformance/` holds every implementation of a port to one suite. The
engine knows only these. Errors are typed by what the caller should do next.
"""

from __future__ import annotations

from sco.ports.contracts import (
    AckReader,
    ContractFeed,
    Contracts,
    ContractsUnavailable,
    Listener,
    TokenAdmin,
    TokenCourier,
    TokenLedger,
)
from sco.ports.events import (
    EventLog,
    LogRecord,
)
from sco.ports.history import PoolHistory
from sco.ports.leases import (
    Fence,
    Fencing,
    Lease,
    Leases,
    LeaseStore,
    LeaseTable,
    Membership,
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
from sco.ports.reclaim import ReclaimCloud, ReclaimFleet
from sco.ports.scheduler import (
    DemandSource,
    NodeView,
    SchedulerCluster,
    SchedulerUnavailable,
)
from sco.ports.secrets import (
    Credential,
    Secret,
    SecretSource,
)
from sco.ports.state import (
    FencedOut,
    FleetAudit,
    FleetCounts,
    FleetReads,
    FleetStore,
    HistoryRow,
    InstanceStore,
    IntentStore,
    NewRequest,
    Outbox,
    PlanStore,
    PoolAgeStore,
    PoolRecord,
    Reservation,
    SignalStore,
    StateConflict,
)

__all__ = [
    "AckReader",
    "Clock",
    "ContractFeed",
    "Contracts",
    "ContractsUnavailable",
    "CreateResult",
    "Credential",
    "DemandSource",
    "EventLog",
    "Fence",
    "FencedOut",
    "Fencing",
    "FleetAudit",
    "FleetCounts",
    "FleetReads",
    "FleetStore",
    "HistoryRow",
    "InstanceStore",
    "InsufficientCapacity",
    "IntentStore",
    "Lease",
    "LeaseStore",
    "LeaseTable",
    "Leases",
    "Listener",
    "LogRecord",
    "Membership",
    "NewRequest",
    "NodeView",
    "Outbox",
    "PermanentProviderError",
    "PlanStore",
    "PoolAgeStore",
    "PoolHistory",
    "PoolRecord",
    "Provider",
    "ProviderError",
    "QuotaExceeded",
    "ReclaimCloud",
    "ReclaimFleet",
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
    "TokenAdmin",
    "TokenCourier",
    "TokenLedger",
]
