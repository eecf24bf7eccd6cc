"""The scheduler side as the controller sees it: the demand of each partition and
the node plane (membership, draining, the work at a reclaim's deadline)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sco.domain.demand import Demand, Partition
from sco.ports.provider import ServerView


class SchedulerUnavailable(Exception):
    """A scheduler cluster (its demand or its nodes) cannot be read now: the partition is
    degraded and acts on nothing until it can."""


@dataclass(frozen=True, slots=True)
class NodeView:
    joined: bool
    drained: bool
    joined_at: float | None = None  # when it joined, by the scheduler's (or provider's) clock
    busy: bool = False  # work runs there: the last to go when the partition shrinks
    pinned: bool = False  # runs work sco's own moves must not disrupt: only a reclaim takes it
    note: str = ""  # what the scheduler says its leaving cuts short: goes into the event
    # Whether the scheduler holds sco's order to leave (a DRAIN, a cordon); None when the
    # plane cannot tell (its order travels another way, as an agent's contract does).
    leaving: bool | None = None
    reclaim_by: float | None = None  # the reclaim deadline the scheduler holds, if any


class SchedulerCluster(Protocol):
    """The node plane as the controller sees it: membership, draining, and the work at a
    reclaim's deadline that the scheduler side does."""

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        """Node state by server id. Reads only: nothing changes in the scheduler (a dry
        run calls it on real schedulers)."""
        ...

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """The scheduler side's own work, which keeps time whether or not the cloud
        answers: requeue or evict a reclaim's work before its deadline, take its node
        out at the deadline. Given this cycle's listing (`servers`), also what depends
        on it: forget the nodes of servers that are gone, label new ones. None: the
        cloud could not be listed, and nothing is done that a listing must justify.
        Raises SchedulerUnavailable when the scheduler cannot be reached."""
        ...

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """Tell a node to leave its scheduler by `drain_by`. `reason` is the action's
        reason code: a `reclaim_notice` drain may cut work short to leave in time; any
        other (sco's own moves) only drains, and never cuts work short. Telling a node
        again, with a sooner deadline or a reclaim, replaces what it was told."""
        ...


class DemandSource(Protocol):
    def partitions(self) -> Sequence[Partition]: ...

    def demand(self, partition: str, now: float) -> Demand: ...

    def next_change_after(self, now: float) -> float | None:
        """When some partition's demand next changes, if known (simulation uses it)."""
        ...
