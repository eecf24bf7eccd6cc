"""Whole jobs into pools. A job of many nodes is lost whole when any pool it spans
is reclaimed (without notice) or requeued whole (with one), so a partition whose work
comes in such gangs does not spread each job over pools: each gang's new units go
into one pool with room, the pool where what it has at stake (its run, or the time
between its checkpoints) is likeliest to finish before a reclaim, weighed against
price. Gangs are placed widest first (they need the most room); a gang no pool has
room for takes the fewest, best pools that hold it. Pure: pools' room, survival
and price in, units per pool and the reasons out."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sco.domain.demand import Gang
from sco.domain.pools import PoolId

Survival = Callable[[PoolId, float], float]  # (pool, seconds) -> chance it lasts them


@dataclass(frozen=True, slots=True)
class GangChoice:
    """Where one gang went, and why."""

    gang: Gang
    pools: Mapping[PoolId, int]
    stake_s: float  # the work a reclaim would cost it, in seconds of its run
    survival: float  # chance the first of its pools lasts that long
    candidates: int  # pools that had room for it whole

    def describe(self) -> str:
        who = f"job {self.gang.name}" if self.gang.name else "a gang"
        stake = f"{self.gang.units} units, {self.stake_s / 3600:.2f} h at stake"
        if not self.pools:
            return f"{who} ({stake}): guaranteed capacity, no spot pool has room for it whole"
        where = ", ".join(f"{n} in {p}" for p, n in self.pools.items())
        whole = "" if len(self.pools) == 1 else f"; no pool had room for {self.gang.units}"
        return (
            f"{who} ({stake}): {where}; survival {self.survival:.3f}, "
            f"best of {self.candidates} pools with room{whole}"
        )


def lasts(
    terms: Mapping[str, float], age_h: float, alpha: float, beta_h: float, seconds: float
) -> float:
    """The chance a pool keeps an instance for `seconds`, from its hazard terms now
    (`sco.decide.hedge.hazard_terms`, per hour). The age term follows its Lomax curve
    (alpha / (beta + age), halved once history shares the weight: a pool that lasts
    grows safer as it ages); the others are rates that hold."""
    hours = seconds / 3600
    weight = 0.5 if "history" in terms else 1.0
    base = beta_h + age_h
    lomax: float = (base / (base + hours)) ** (alpha * weight)
    rest = sum(h for k, h in terms.items() if k != "age")
    return lomax * math.exp(-rest * hours)


def waste(survival: float) -> float:
    """Runs thrown away per run that finishes, in stakes, where a run lasts with chance
    `survival`: each try fails with chance q = 1 - survival, and a failed try loses
    half its stake on average, so q / (1 - q) / 2."""
    q = min(1.0 - survival, _MOST_LIKELY_LOSS)
    return q / (1.0 - q) / 2.0


_MOST_LIKELY_LOSS = 0.999  # a pool certain to fail costs much, not infinitely


def place_gangs(
    gangs: Sequence[Gang],
    room: Mapping[PoolId, int],
    survival: Survival,
    price: Mapping[PoolId, float],
    loss_weight: float,
    default_s: float,
) -> tuple[Counter[PoolId], list[GangChoice]]:
    """Units per pool for `gangs` within `room` (new units each pool may take), and
    the choice made for each. A pool costs a gang `loss_weight` x the runs it would
    throw away there (`waste`), plus the pool's price term (`price`: 0 for the
    cheapest). A gang that must run whole (`Gang.whole`) and that no pool has room
    for is left off spot (no pools): guaranteed capacity takes it whole."""
    left = {p: r for p, r in room.items() if r > 0}
    counts: Counter[PoolId] = Counter()
    choices: list[GangChoice] = []
    for g in sorted(gangs, key=lambda g: -g.units):
        stake = g.at_stake_s(default_s)

        def cost(p: PoolId, stake: float = stake) -> tuple[float, PoolId]:
            return (loss_weight * waste(survival(p, stake)) + price.get(p, 0.0), p)

        whole = [p for p, r in left.items() if r >= g.units]
        if g.whole and not whole:  # split, it could not run: guaranteed takes it
            choices.append(GangChoice(g, {}, stake, 0.0, 0))
            continue
        order = sorted(whole or left, key=cost)
        where: dict[PoolId, int] = {}
        need = g.units
        for p in order:
            take = min(need, left[p])
            where[p] = take
            need -= take
            if need == 0:
                break
        for p, n in where.items():
            left[p] -= n
            counts[p] += n
            if left[p] == 0:
                del left[p]
        if where:
            first = next(iter(where))
            choices.append(GangChoice(g, where, stake, survival(first, stake), len(whole)))
    return counts, choices
