"""Leases kept in one place, fencing in fleet state: the lease port when partition
leases live outside the fleet-state database (Kubernetes Leases).

The claim in fleet state is held as long as the lease (renewed with it, handed back
with it), so that during a rolling change of lease kind a replica whose leases are
kept in the database sees the partition held, and does not take it: without it, the
old and the new kind fenced each other every TTL and both acted in between."""

from __future__ import annotations

import logging

from sco.ports import Fencing, Lease, LeaseTable

log = logging.getLogger(__name__)


class PairedLeases:
    """`sco.ports.LeaseStore` from a lease table (leases and membership) and fleet
    state's fencing, which every write of a partition's rows is checked against."""

    def __init__(self, table: LeaseTable, fencing: Fencing) -> None:
        self.table = table
        self.fencing = fencing

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        return self.table.acquire(partition, holder, ttl_s, now)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        """The lease, and the claim in fleet state with it: replicas whose leases are
        kept in the database see the partition held for as long as the lease is."""
        renewed = self.table.renew(lease, ttl_s, now)
        if renewed is None:
            return None
        try:
            fence = self.claim_fence(
                lease.partition, lease.holder, lease.token, renewed.expires_at, now
            )
        except Exception as e:
            # The lease holds; the claim is extended at the next renewal that reaches
            # fleet state (while it is away, no replica of either kind can take it).
            log.debug("claim of %s not extended: %s", lease.partition, e)
            return renewed
        if fence is None:  # a replica of the other lease kind took it while ours lapsed
            self.table.release(renewed)
            return None
        return renewed

    def release(self, lease: Lease) -> None:
        self.table.release(lease)
        try:
            self.fencing.release_fence(lease.partition, lease.holder)
        except Exception as e:
            log.debug("claim of %s not handed back: %s", lease.partition, e)

    def leases(self) -> list[Lease]:
        return self.table.leases()

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        self.table.heartbeat(name, ttl_s, now)

    def live_replicas(self, now: float) -> list[str]:
        return self.table.live_replicas(now)

    def forget_replica(self, name: str) -> None:
        self.table.forget_replica(name)

    def claim_fence(
        self, partition: str, holder: str, token: int, until: float, now: float
    ) -> int | None:
        return self.fencing.claim_fence(partition, holder, token, until, now)

    def release_fence(self, partition: str, holder: str) -> None:
        self.fencing.release_fence(partition, holder)
