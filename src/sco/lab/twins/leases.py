"""Partition leases in memory: the twins of the lease port's two implementations.

- `MemoryLeaseTable` is the fleet-state database's `leases` and `replicas`
  tables (`SqlLeases`): a lease row per partition whose token grows at every new
  holder, replica heartbeats, and the fencing record every write of a partition's
  rows is checked against (`MemoryFleetStore` holds one and checks its writes
  with it, as the database's triggers do).
- `KubeLeases` keeps leases as Kubernetes does (`KubernetesLeases`): the token is
  the Lease's `leaseTransitions` (one more at every change of holder), and a Lease
  deleted and created again counts from 1 again, which fleet state's fencing must
  survive; replicas announce themselves with leases of their own.

`tests/conformance/` holds both to the same suite as their real adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sco.ports import FencedOut, Lease


@dataclass
class _Held:
    holder: str
    token: int
    expires_at: float


def _renewed(held: _Held | None, lease: Lease, ttl_s: float, now: float) -> Lease | None:
    """Both kinds renew alike: only the holder, at its token, before it ran out."""
    if held is None or (held.holder, held.token) != (lease.holder, lease.token):
        return None
    if held.expires_at < now:
        return None
    held.expires_at = now + ttl_s
    return Lease(lease.partition, lease.holder, lease.token, held.expires_at)


@dataclass
class MemoryLeaseTable:
    """`sco.ports.LeaseStore` as the fleet-state database keeps it, in memory."""

    _rows: dict[str, _Held] = field(default_factory=dict)
    _replicas: dict[str, float] = field(default_factory=dict)

    def token(self, partition: str) -> int:
        """The largest token `partition` was taken or claimed with (0: none): a write
        of its rows below it is refused."""
        row = self._rows.get(partition)
        return row.token if row is not None else 0

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        row = self._rows.get(partition)
        if row is None:
            self._rows[partition] = _Held(holder, 1, now + ttl_s)
            return Lease(partition, holder, 1, now + ttl_s)
        if row.holder == holder and row.expires_at >= now:
            row.expires_at = now + ttl_s
            return Lease(partition, holder, row.token, row.expires_at)
        if row.expires_at >= now:
            return None
        row.holder, row.token, row.expires_at = holder, row.token + 1, now + ttl_s
        return Lease(partition, holder, row.token, row.expires_at)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        return _renewed(self._rows.get(lease.partition), lease, ttl_s, now)

    def release(self, lease: Lease) -> None:
        row = self._rows.get(lease.partition)
        if row is not None and row.holder == lease.holder and row.token == lease.token:
            row.expires_at, row.holder = -1.0, ""

    def leases(self) -> list[Lease]:
        return [Lease(p, r.holder, r.token, r.expires_at) for p, r in sorted(self._rows.items())]

    def claim_fence(
        self, partition: str, holder: str, token: int, until: float, now: float
    ) -> int | None:
        row = self._rows.get(partition)
        if row is None:
            # As the database: the claim is a lease row, live until `until`.
            self._rows[partition] = _Held(holder, token, until)
            return token
        mine = row.holder == holder and row.token >= token
        if not mine and row.holder and row.expires_at >= now:
            return None  # another replica's claim, live
        if mine:
            row.expires_at = max(row.expires_at, until)
            return row.token  # its own: the lease row, or its earlier claim
        row.token, row.holder, row.expires_at = max(token, row.token + 1), holder, until
        return row.token

    def release_fence(self, partition: str, holder: str) -> None:
        row = self._rows.get(partition)
        if row is not None and row.holder == holder:
            row.expires_at, row.holder = -1.0, ""

    def check(self, partitions: set[str], fence: int) -> None:
        """Refuse a write carrying `fence` to rows of `partitions` below their token."""
        for p in sorted(partitions):
            current = self.token(p)
            if fence < current:
                raise FencedOut(f"stale fencing token: {fence} < current token {current} of {p}")

    # ------------------------------------------------------------ membership

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        self._replicas[name] = now + ttl_s

    def live_replicas(self, now: float) -> list[str]:
        return sorted(n for n, t in self._replicas.items() if t >= now)

    def forget_replica(self, name: str) -> None:
        self._replicas.pop(name, None)

    def lapse(self, holder: str) -> None:
        """What a holder that died without a word leaves: its heartbeat and its leases
        run out, unreleased (the swarm's faults, tests)."""
        for row in self._rows.values():
            if row.holder == holder:
                row.expires_at = 0.0
        if holder in self._replicas:
            self._replicas[holder] = 0.0


@dataclass
class KubeLeases:
    """Leases and membership as Kubernetes Leases keep them; `available` false: the API
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
        return _renewed(self._leases.get(lease.partition), lease, ttl_s, now)

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
