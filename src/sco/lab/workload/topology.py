"""Which free nodes a job of many nodes gets on slurmctld.

With a constraint to one pool (`[pool-a|pool-b|..]`, matching OR: what sco's
job_submit.lua adds), the first pool in the bracket's order whose free nodes hold
the job, or none (it waits). With topology/tree, a switch per pool under one per
hall: the fewest switches that hold it. A job that fits one
pool's free nodes gets the pool that fits it most tightly (the others keep their room
for wider jobs); else one hall's, taking its fullest pools first; else the cluster's,
fullest pools first. Nodes within a pool go in the order they came."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar


class Placed(Protocol):
    @property
    def where(self) -> tuple[str, str]: ...  # (hall, pool)


N = TypeVar("N", bound=Placed)


def pick(free: Sequence[N], want: int) -> list[N]:
    """`want` of `free` (in their order), as few pools and halls as hold them."""
    pools: dict[tuple[str, str], list[N]] = {}
    for n in free:
        pools.setdefault(n.where, []).append(n)
    fits = [ns for ns in pools.values() if len(ns) >= want]
    if fits:
        return min(fits, key=len)[:want]
    halls: dict[str, list[list[N]]] = {}
    for where, ns in pools.items():
        halls.setdefault(where[0], []).append(ns)
    roomy = [hs for hs in halls.values() if sum(map(len, hs)) >= want]
    groups = min(roomy, key=lambda hs: sum(map(len, hs))) if roomy else list(pools.values())
    taken: list[N] = []
    for ns in sorted(groups, key=len, reverse=True):
        taken += ns[: want - len(taken)]
        if len(taken) == want:
            break
    return taken


def first_pool(free: Sequence[N], want: int, order: Sequence[str]) -> list[N]:
    """`want` of `free` on one pool, the first of `order` that holds them (then any
    other, by name); none when no pool does."""
    pools: dict[str, list[N]] = {}
    for n in free:
        pools.setdefault(n.where[1], []).append(n)
    rank = {p: i for i, p in enumerate(order)}
    fits = [p for p, ns in pools.items() if len(ns) >= want]
    if not fits:
        return []
    best = min(fits, key=lambda p: (rank.get(p, len(rank)), p))
    return pools[best][:want]


def where(features: frozenset[str], topology: Mapping[str, str] | None) -> tuple[str, str]:
    """(hall, pool) of a node with these features: its switches, when the cluster has
    a topology (pool feature -> hall); its pool is known by its feature either way."""
    pool = next((f for f in sorted(features) if f.startswith("pool-")), "")
    return ((topology or {}).get(pool, ""), pool)


def room_for(free: Sequence[Placed], want: int, one_pool: bool) -> bool:
    """Whether a job of `want` nodes may start on `free`: anywhere, or with the
    one-pool constraint on a job of many nodes, on one pool's nodes."""
    if want > len(free):
        return False
    if not one_pool or want < 2:
        return True
    counts: dict[str, int] = {}
    for n in free:
        counts[n.where[1]] = counts.get(n.where[1], 0) + 1
    return max(counts.values()) >= want
