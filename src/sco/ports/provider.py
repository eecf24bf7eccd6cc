"""The cloud as the controller sees it: pools, headroom, prices, servers; errors
typed by what the caller does next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sco.domain.pools import Pool, PoolId


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


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch of this clock."""
        ...


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
    # the notice as set when it is not a time: no deadline is in force (notice_deadline
    # None), and nothing acts on it but to report it
    notice_unreadable: str = ""
    fault: str = ""
    active_at: float | None = None  # when it became ACTIVE, by the provider's own clock
    refused: bool = False  # the provider could not place it (no valid host): it never ran
    # the provider shows no node token on it: none handed over yet, or one that another
    # write to its metadata took away (Nova writes a server's metadata whole)
    token_missing: bool = False


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
