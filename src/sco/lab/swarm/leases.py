"""Partition leases as Kubernetes keeps them, in memory, for the swarm.

As `KubernetesLeases` reads a `coordination.k8s.io/v1` Lease: the token is the
Lease's `leaseTransitions` (one more at every change of holder), and a Lease
deleted and created again counts from 1 again, which the fleet-state database
must survive (`SqlFleetStore.claim_fence`). Replicas announce themselves with
leases of their own, as `KubernetesLeases.heartbeat` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sco.ports import Lease


@dataclass
class _Held:
    holder: str
    token: int
    expires_at: float


@dataclass
class MemoryLeases:
    """`sco.ports.LeaseManager` and replica membership; `available` false: the API
    server cannot be reached (every call raises)."""

    available: bool = True
    _leases: dict[str, _Held] = field(default_factory=dict)
    _replicas: dict[str, float] = field(default_factory=dict)

    def _reach(self) -> None:
        if not self.available:
            raise ConnectionError("the Kubernetes API server cannot be reached")

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        self._reach()
        held = self._leases.get(partition)
        if held is None:
            held = self._leases[partition] = _Held(holder, 1, now + ttl_s)
            return Lease(partition, holder, 1, held.expires_at)
        mine = held.holder == holder and held.expires_at >= now
        if not mine and held.expires_at >= now:
            return None
        if not mine:
            held.holder, held.token = holder, held.token + 1
        held.expires_at = now + ttl_s
        return Lease(partition, holder, held.token, held.expires_at)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        self._reach()
        held = self._leases.get(lease.partition)
        if held is None or held.holder != lease.holder or held.token != lease.token:
            return None
        if held.expires_at < now:
            return None
        held.expires_at = now + ttl_s
        return Lease(lease.partition, lease.holder, lease.token, held.expires_at)

    def release(self, lease: Lease) -> None:
        self._reach()
        held = self._leases.get(lease.partition)
        if held is not None and held.holder == lease.holder and held.token == lease.token:
            held.expires_at, held.holder = float("-inf"), ""

    def leases(self) -> list[Lease]:
        self._reach()
        return [Lease(p, h.holder, h.token, h.expires_at) for p, h in sorted(self._leases.items())]

    # ------------------------------------------------------------ membership

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        self._reach()
        self._replicas[name] = now + ttl_s

    def live_replicas(self, now: float) -> list[str]:
        self._reach()
        return sorted(n for n, t in self._replicas.items() if t >= now)

    def forget_replica(self, name: str) -> None:
        self._reach()
        self._replicas.pop(name, None)

    # ------------------------------------------------------------ what the swarm does to them

    def recreate(self, partition: str) -> None:
        """The Lease is deleted (and the next holder creates it anew, at token 1)."""
        self._leases.pop(partition, None)

    def expire(self, holder: str, now: float) -> None:
        """`holder`'s leases lapse now (it stalled past its TTL)."""
        for held in self._leases.values():
            if held.holder == holder:
                held.expires_at = min(held.expires_at, now - 1.0)
