"""Contracts: what a node is told about itself."""

from __future__ import annotations

from dataclasses import dataclass

from sco.domain.instances import Instance


@dataclass(frozen=True, slots=True)
class Contract:
    """A node's terms: where it belongs, until when, and when it must leave."""

    instance_id: str
    partition: str
    pool: str
    capacity_class: str
    plan_generation: int
    join: str  # how to join its scheduler (endpoint or token reference, never a secret)
    lease_expires_at: float
    drain_by: float | None


def contract_for(instance: Instance, join: str, now: float, lease_s: float) -> Contract:
    """The contract of `instance` as of `now`; the lease runs `lease_s` from now."""
    return Contract(
        instance_id=instance.id,
        partition=instance.partition,
        pool=instance.pool,
        capacity_class=str(instance.capacity_class),
        plan_generation=instance.plan_generation,
        join=join,
        lease_expires_at=now + lease_s,
        drain_by=instance.drain_by,
    )
