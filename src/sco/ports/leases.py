"""Partition leases: one leader per partition, with a fencing token."""

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
