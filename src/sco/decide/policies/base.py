"""What every policy shares: the decision it returns and helpers to read a snapshot.

A policy is the planner + arbiter pair the controller calls each cycle: a
snapshot in, spot and guaranteed instance targets per pool out. The `sco`
policy is a pure function of the snapshot. Baselines that, as published,
remember what they saw (SpotHedge's preempted zones, round robin's next
zone) keep that memory in the policy object: one object per partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sco.domain.lifecycle import State
from sco.domain.plans import PoolReason
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class Decision:
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...] = ()
    pools: Mapping[PoolId, PoolReason] = field(default_factory=dict)  # why, pool by pool
    terms: Mapping[str, float] = field(default_factory=dict)  # the partition's figures
    # Per pool, the fewest instances one create there should ask for: a gang's nodes
    # come together or not at all (the acquirer's batch is raised to it).
    batches: Mapping[PoolId, int] = field(default_factory=dict)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def keeps_floor(self) -> bool:
        """Whether it holds the partition's floor on guaranteed capacity when spot
        cannot: only such a policy may run a real partition (`sco run`); the others
        are baselines to measure against (`sco simulate`, `sco evaluate`)."""
        ...

    def decide(self, snapshot: PartitionSnapshot) -> Decision: ...


def spot_views(snapshot: PartitionSnapshot) -> list[PoolView]:
    """The spot pools this partition may use, in a stable order."""
    return snapshot.usable(spot=True)


def live_by_pool(snapshot: PartitionSnapshot, spot: bool) -> Counter[PoolId]:
    """Live instances (not leaving) per pool, of one capacity class."""
    return Counter(i.pool for i in snapshot.instances if i.is_live and i.is_spot == spot)


def ready_spot_units(snapshot: PartitionSnapshot) -> int:
    return sum(i.units for i in snapshot.instances if i.is_spot and i.state is State.READY)
