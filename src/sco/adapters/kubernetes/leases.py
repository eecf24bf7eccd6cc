"""Partition leases as Kubernetes `coordination.k8s.io/v1` Leases (extra `kubernetes`).

One Lease `sco-<partition>` per partition: `holderIdentity` is the replica,
`renewTime + leaseDurationSeconds` the expiry, and `leaseTransitions` (one
more at every change of holder) the fencing token. Every change is a replace
with the Lease's `resourceVersion`, so the API server refuses the loser of a
race (409). Replicas announce themselves with a Lease `sco-replica-<name>`.

The database still enforces fencing: the runner copies every token it takes
into the fleet-state database (`SqlFleetStore.raise_fence`), whose triggers
refuse older ones.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sco.ports import Lease

PREFIX = "sco-"
REPLICA_PREFIX = "sco-replica-"
_UNSAFE = re.compile(r"[^a-z0-9-]")


def lease_name(partition: str, prefix: str = PREFIX) -> str:
    """A DNS-1123 name for a partition (lowercase, digits, '-')."""
    name = prefix + _UNSAFE.sub("-", partition.lower())
    if len(name) > 253:
        raise ValueError(f"partition {partition!r} makes too long a Lease name")
    return name


def _time(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def _seconds(t: datetime | None) -> float:
    return t.timestamp() if t is not None else float("-inf")


class KubernetesLeases:
    """`sco.ports.LeaseManager` (and replica membership) on a namespace's Leases.

    `api` is a `kubernetes.client.CoordinationV1Api`."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    # ------------------------------------------------------------ LeaseManager

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        from kubernetes.client.exceptions import ApiException

        name = lease_name(partition)
        try:
            current = self.api.read_namespaced_lease(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return self._create(name, partition, holder, ttl_s, now)
        spec = current.spec
        expires = _seconds(spec.renew_time) + (spec.lease_duration_seconds or 0)
        mine = spec.holder_identity == holder and expires >= now
        if not mine and expires >= now:
            return None
        spec.renew_time = _time(now)
        spec.lease_duration_seconds = _duration(ttl_s)
        if not mine:
            spec.holder_identity = holder
            spec.acquire_time = _time(now)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        try:
            self.api.replace_namespaced_lease(name, self.namespace, current)
        except ApiException as e:
            if e.status == 409:
                return None  # another replica changed it first
            raise
        return Lease(partition, holder, int(spec.lease_transitions), now + ttl_s)

    def _create(
        self, name: str, partition: str, holder: str, ttl_s: float, now: float
    ) -> Lease | None:
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        body = V1Lease(
            metadata=V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "sco"}),
            spec=V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=_duration(ttl_s),
                acquire_time=_time(now),
                renew_time=_time(now),
                lease_transitions=1,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                return None  # created by another replica meanwhile
            raise
        return Lease(partition, holder, 1, now + ttl_s)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        from kubernetes.client.exceptions import ApiException

        name = lease_name(lease.partition)
        try:
            current = self.api.read_namespaced_lease(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        spec = current.spec
        expires = _seconds(spec.renew_time) + (spec.lease_duration_seconds or 0)
        if (
            spec.holder_identity != lease.holder
            or (spec.lease_transitions or 0) != lease.token
            or expires < now
        ):
            return None
        spec.renew_time = _time(now)
        spec.lease_duration_seconds = _duration(ttl_s)
        try:
            self.api.replace_namespaced_lease(name, self.namespace, current)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        return Lease(lease.partition, lease.holder, lease.token, now + ttl_s)

    def release(self, lease: Lease) -> None:
        """Expire it now; `leaseTransitions` stays, so the next token is larger."""
        from kubernetes.client.exceptions import ApiException

        name = lease_name(lease.partition)
        try:
            current = self.api.read_namespaced_lease(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        spec = current.spec
        if spec.holder_identity != lease.holder or spec.lease_transitions != lease.token:
            return
        # No holder, as client-go's leader election hands a Lease back: a replica that
        # died leaves its name there, and others may rescue its partitions beyond their share.
        spec.renew_time = _time(0)
        spec.holder_identity = ""
        try:
            self.api.replace_namespaced_lease(name, self.namespace, current)
        except ApiException as e:
            if e.status != 409:
                raise

    def leases(self) -> list[Lease]:
        out = []
        for item in self.api.list_namespaced_lease(self.namespace).items:
            name = item.metadata.name
            if not name.startswith(PREFIX) or name.startswith(REPLICA_PREFIX):
                continue
            spec = item.spec
            out.append(
                Lease(
                    name[len(PREFIX) :],
                    spec.holder_identity or "",
                    int(spec.lease_transitions or 0),
                    _seconds(spec.renew_time) + (spec.lease_duration_seconds or 0),
                )
            )
        return sorted(out, key=lambda x: x.partition)

    # ------------------------------------------------------------ membership

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        """A Lease per replica, renewed by it alone."""
        lease = self.acquire_replica(name, ttl_s, now)
        if lease is None:
            raise RuntimeError(f"replica name {name!r} is held by another process")

    def acquire_replica(self, name: str, ttl_s: float, now: float) -> Lease | None:
        return self.acquire(_replica_key(name), name, ttl_s, now)

    def live_replicas(self, now: float) -> list[str]:
        alive = []
        for item in self.api.list_namespaced_lease(self.namespace).items:
            if not item.metadata.name.startswith(REPLICA_PREFIX):
                continue
            spec = item.spec
            if _seconds(spec.renew_time) + (spec.lease_duration_seconds or 0) >= now:
                alive.append(spec.holder_identity or "")
        return sorted(alive)

    def forget_replica(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.delete_namespaced_lease(lease_name(_replica_key(name)), self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise


def _replica_key(name: str) -> str:
    return "replica-" + name


def _duration(ttl_s: float) -> int:
    return max(1, round(ttl_s))


def connect(
    namespace: str, kubeconfig: str | None = None, context: str | None = None
) -> KubernetesLeases:
    """Leases in `namespace`, through a kubeconfig file or (None) the in-cluster
    service account. Connects lazily: the first call reaches the API server."""
    from kubernetes import client, config

    if kubeconfig:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    else:
        config.load_incluster_config()
        api_client = client.ApiClient()
    return KubernetesLeases(client.CoordinationV1Api(api_client), namespace)
