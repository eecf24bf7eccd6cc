"""Leases kept in one place, fencing in fleet state: the lease port when partition
leases live outside the fleet-state database (Kubernetes Leases)."""

from __future__ import annotations

from sco.ports import Fencing, Lease, LeaseTable


class PairedLeases:
    """`sco.ports.LeaseStore` from a lease table (leases and membership) and fleet
    state's fencing, which every write of a partition's rows is checked against."""

    def __init__(self, table: LeaseTable, fencing: Fencing) -> None:
        self.table = table
        self.fencing = fencing

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        return self.table.acquire(partition, holder, ttl_s, now)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        return self.table.renew(lease, ttl_s, now)

    def release(self, lease: Lease) -> None:
        self.table.release(lease)

    def leases(self) -> list[Lease]:
        return self.table.leases()

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        self.table.heartbeat(name, ttl_s, now)

    def live_replicas(self, now: float) -> list[str]:
        return self.table.live_replicas(now)

    def forget_replica(self, name: str) -> None:
        self.table.forget_replica(name)

    def claim_fence(self, partition: str, holder: str, token: int) -> int:
        return self.fencing.claim_fence(partition, holder, token)
