"""Policies by name: each turns a snapshot into spot and guaranteed targets.

New policies register here by name, as Cluster Autoscaler registers expanders.
`optimal` knows the future and so runs only in `sco evaluate`
(`sco.lab.crosscheck`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sco.decide.policies.all_guaranteed import AllGuaranteedPolicy
from sco.decide.policies.base import Decision, Policy
from sco.decide.policies.cheapest import CheapestPolicy
from sco.decide.policies.even_spread import EvenSpreadPolicy
from sco.decide.policies.round_robin import RoundRobinPolicy
from sco.decide.policies.sco import ScoPolicy
from sco.decide.policies.spothedge import SpotHedgePolicy
from sco.domain.words import unknown

POLICIES: Mapping[str, Callable[[], Policy]] = {
    "sco": ScoPolicy,
    "all-guaranteed": AllGuaranteedPolicy,
    "cheapest": CheapestPolicy,
    "even-spread": EvenSpreadPolicy,
    "round-robin": RoundRobinPolicy,
    "spothedge": SpotHedgePolicy,
}


class UnknownPolicy(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return unknown("policy", self.name, POLICIES)


def policy_named(name: str) -> Policy:
    """A new policy object (baselines keep per-partition memory: one each)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise UnknownPolicy(name) from None


def runnable_policy(name: str) -> str:
    """`name`, if it may run a real partition: a known policy that keeps the floor
    (`Policy.keeps_floor`). Otherwise a ValueError saying why, in one line: a
    baseline that keeps no floor is for `sco simulate` and `sco evaluate` only."""
    try:
        policy = policy_named(name)
    except UnknownPolicy as e:
        raise ValueError(str(e)) from None
    if not policy.keeps_floor:
        floor = ", ".join(sorted(n for n, make in POLICIES.items() if make().keeps_floor))
        raise ValueError(
            f"{name!r} keeps no floor: a baseline for sco simulate and sco evaluate, "
            f"not for a real partition; one of {floor}"
        )
    return name


__all__ = [
    "POLICIES",
    "AllGuaranteedPolicy",
    "CheapestPolicy",
    "Decision",
    "EvenSpreadPolicy",
    "Policy",
    "RoundRobinPolicy",
    "ScoPolicy",
    "SpotHedgePolicy",
    "UnknownPolicy",
    "policy_named",
    "runnable_policy",
]
