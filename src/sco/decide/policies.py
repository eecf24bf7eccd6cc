"""Policies by name: each turns a snapshot into spot and guaranteed targets.

A policy is the pure planner + arbiter pair the controller calls each cycle.
New policies register here by name, as Cluster Autoscaler registers expanders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.planner import PlannerConfig, plan_spot
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class Decision:
    spot: Mapping[PoolId, int]
    guaranteed: Mapping[PoolId, int]
    notes: tuple[str, ...] = ()


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, snapshot: PartitionSnapshot) -> Decision: ...


@dataclass(frozen=True, slots=True)
class ScoPolicy:
    """The default: score-spread spot, floor kept by guaranteed."""

    planner: PlannerConfig = field(default_factory=PlannerConfig)
    arbiter: ArbiterConfig = field(default_factory=ArbiterConfig)
    name: str = "sco"

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        spot = plan_spot(snapshot, self.planner)
        guaranteed = arbitrate(snapshot, self.arbiter)
        return Decision(spot.targets, guaranteed.targets, spot.notes + guaranteed.notes)


@dataclass(frozen=True, slots=True)
class AllGuaranteedPolicy:
    """Baseline: every wanted unit on guaranteed capacity, no spot."""

    arbiter: ArbiterConfig = field(default_factory=lambda: ArbiterConfig(release_after_s=0))
    name: str = "all-guaranteed"

    def decide(self, snapshot: PartitionSnapshot) -> Decision:
        wanted = snapshot.demand.wanted_units
        g = arbitrate(snapshot, self.arbiter, cover_units=wanted)
        return Decision({}, g.targets, g.notes)


POLICIES: Mapping[str, Callable[[], Policy]] = {
    "sco": ScoPolicy,
    "all-guaranteed": AllGuaranteedPolicy,
}


class UnknownPolicy(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown policy {self.name!r}; known: {', '.join(sorted(POLICIES))}"


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise UnknownPolicy(name) from None
