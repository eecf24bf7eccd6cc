"""Partition leases: one leader per partition, the replicas that share them, and the
fencing token every write of a leader carries.

The lease port is three roles one object offers (`LeaseStore`): the leases
themselves, replica membership (who is alive, for the fair share), and fencing
(the token fleet state refuses writes below). Leases may live in the fleet-state
database or in Kubernetes; fencing always lives in fleet state, which enforces
it, so a lease store kept elsewhere is paired with fleet state's fencing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lease:
    """Who may act on a partition until when; `token` grows with every new holder
    and fences the holder's writes."""

    partition: str
    holder: str
    token: int
    expires_at: float


class Leases(Protocol):
    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        """Take the partition's lease if it is free or expired (a new, larger token),
        or extend it if `holder` has it; None when someone else holds it."""
        ...

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        """Extend a held lease; None when it was lost (expired and taken, or gone)."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up now, if still held: it expires with no holder, and the
        next holder's token is still larger."""
        ...

    def leases(self) -> list[Lease]:
        """Every partition's lease as it stands, by partition."""
        ...


class Membership(Protocol):
    """The replicas that share the partitions: each heartbeats, and a replica that stops
    falls out of the membership when its heartbeat expires."""

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None: ...

    def live_replicas(self, now: float) -> list[str]:
        """Names of the replicas whose heartbeat has not expired, sorted."""
        ...

    def forget_replica(self, name: str) -> None: ...


class Fencing(Protocol):
    """Fleet state's record of each partition's writer: the largest token it was
    written with, who holds it and until when."""

    def claim_fence(
        self, partition: str, holder: str, token: int, until: float, now: float
    ) -> int | None:
        """The fencing token `holder` writes `partition` with, now that it has taken (or
        renewed) the partition's lease with `token`, held until `until`: that token
        when fleet state has seen none as large, else one past the largest it has seen
        (a lease kept elsewhere may count from 1 again: a Kubernetes Lease recreated).
        Every write carrying a smaller token is refused from then on
        (`sco.ports.FencedOut`). Its own claim again: the same token, held until
        `until` if that is later. None while another holder's claim is live (expires
        at or after `now`): during a rolling change of lease kind, a replica of the
        other kind writes the partition, and the two must not fence each other in
        turn."""
        ...

    def release_fence(self, partition: str, holder: str) -> None:
        """`holder` hands its claim back: the record (its token) stays, no longer live."""
        ...


class LeaseTable(Leases, Membership, Protocol):
    """Leases and replica membership, kept in one place (a database, Kubernetes)."""


class LeaseStore(LeaseTable, Fencing, Protocol):
    """The lease port a replica runner takes: leases, membership and fencing."""


class Fence:
    """The fencing token a partition's controller writes with: its replica's, while the
    replica holds the partition's lease; 0 once it let the lease go, which fleet state
    refuses as soon as the partition has a lease. The runner that holds the lease sets
    it; the controller only reads it, at every write."""

    __slots__ = ("partition", "token")

    def __init__(self, partition: str, token: int = 0) -> None:
        self.partition = partition
        self.token = token

    def revoke(self) -> None:
        self.token = 0

    def __repr__(self) -> str:
        return f"Fence({self.partition!r}, {self.token})"
