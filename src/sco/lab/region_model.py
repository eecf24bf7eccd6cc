"""What the simulated region is made of, for every part of it: how it behaves
(`SimConfig`), whom it tells (`SimObserver`), its servers (`Server`) and the kinds
of event on its clock (`Kind`). Nothing here imports the region."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import Pool, PoolId
from sco.ports import Secret, ServerStatus

COLD_START_S = 120.0  # a create to its server ACTIVE, unless told otherwise


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of the simulated provider. Times in seconds."""

    api_latency_s: float = 1.0  # a create's servers appear in listings after this
    cold_start_s: float = COLD_START_S  # create call to server ACTIVE
    join_s: float = 0.0  # ACTIVE to node joined in its scheduler
    drain_s: float = 30.0  # a node's drain takes this long
    delete_s: float = 5.0  # a deleted server holds its capacity this long
    notice_s: float = 0.0  # reclaim notice lead time; 0: reclaims come unannounced
    pool_size: int | None = None  # a 1 in a 0/1 trace (None: the region spec's), and
    # a unit of a count trace (None: 1)
    unlimited_binary: bool = False  # a 1 in a 0/1 trace means unlimited capacity
    guaranteed_quota_per_hall: int | None = None  # None: the region spec's
    error_rate: float = 0.0  # chance a call fails with a retryable 5xx
    timeout_rate: float = 0.0  # chance a create times out (and took effect half the time)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("api_latency_s", "cold_start_s", "join_s", "drain_s", "delete_s", "notice_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("error_rate", "timeout_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


class SimObserver(Protocol):
    """What the region reports as it happens, for accounting and reports."""

    def held(self, t: float, pool: PoolId, partition: str, delta: int) -> None: ...

    def running(
        self, t: float, partition: str, pool: PoolId, delta_units: int, created_at: float
    ) -> None: ...

    def price(self, t: float, pool: PoolId, price_per_h: float) -> None: ...

    def capacity(self, t: float, pool: PoolId, instances: int) -> None: ...

    def reclaimed(
        self, t: float, partition: str, pool: PoolId, units: int, notice_s: float
    ) -> None:
        """A reclaim announced (`notice_s` ahead) or done without notice (0)."""
        ...

    def created(self, t: float, partition: str, pool: PoolId, count: int) -> None: ...


class Kind(IntEnum):
    # Lower runs first at equal times: servers leave before capacity is checked.
    RECLAIM = 0
    DELETED = 1
    CAPACITY = 2
    NOTICE = 3
    PRICE = 4
    LISTED = 5
    ACTIVE = 6
    JOINED = 7
    DRAIN_START = 8
    DRAINED = 9


@dataclass(slots=True)
class Server:
    server_id: str
    partition: str
    pool: Pool
    request_id: str
    plan_generation: int
    created_at: float
    listed: bool = False
    status: ServerStatus = ServerStatus.BUILD
    joined: bool = False
    running: bool = False
    draining: bool = False
    drained: bool = False
    installation: str = DEFAULT_INSTALLATION  # which sco made it (several may share a region)
    drain_by: float | None = None  # the deadline the node was told
    reclaim_by: float | None = None  # ... when told by a reclaim
    deleting: bool = False
    notice_deadline: float | None = None
    active_at: float | None = None
    joined_at: float | None = None
    token: Secret | None = None  # the node token in its metadata, for its agent
