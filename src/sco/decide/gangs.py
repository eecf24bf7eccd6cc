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
# (units, what staying saves: None for what is held) -> spot units per pool
Spread = Callable[[int, Mapping[PoolId, int] | None], dict[PoolId, int]]


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
        if not self.pools and not self.candidates:
            return f"{who} ({stake}): guaranteed capacity, no spot pool has room for it whole"
        if not self.pools:
            return (
                f"{who} ({stake}): guaranteed capacity; the best spot pool's survival "
                f"{self.survival:.3f} is not worth the risk at its price"
            )
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
    held: Mapping[PoolId, int] | None = None,
    guaranteed: float | None = None,
) -> tuple[Counter[PoolId], list[GangChoice]]:
    """Units per pool for `gangs` within `room` (new units each pool may take), and
    the choice made for each. A pool costs a gang `loss_weight` x the runs it would
    throw away there (`waste`), plus the pool's price term (`price`: 0 for the
    cheapest). Units `held` in a pool and unclaimed (a gang's nodes still booting)
    draw a gang there first: moving it would cost a cold start. A gang that must run
    whole (`Gang.whole`) and that no pool has room for is left off spot (no pools):
    guaranteed capacity takes it whole; so is one whose best pool costs more than
    `guaranteed` (guaranteed capacity's price term; it is never reclaimed)."""
    left = {p: r for p, r in room.items() if r > 0}
    unclaimed = dict(held or {})
    counts: Counter[PoolId] = Counter()
    choices: list[GangChoice] = []
    for g in sorted(gangs, key=lambda g: -g.units):
        stake = g.at_stake_s(default_s)

        def cost(
            p: PoolId, stake: float = stake, units: int = g.units
        ) -> tuple[int, float, PoolId]:
            there = min(units, unclaimed.get(p, 0))
            risk = loss_weight * waste(survival(p, stake)) + price.get(p, 0.0)
            return (-there, risk, p)

        whole = [p for p, r in left.items() if r >= g.units]
        if g.whole and not whole:  # split, it could not run: guaranteed takes it
            choices.append(GangChoice(g, {}, stake, 0.0, 0))
            continue
        order = sorted(whole or left, key=cost)
        if order and guaranteed is not None and cost(order[0])[1] > guaranteed:
            choices.append(GangChoice(g, {}, stake, survival(order[0], stake), len(whole)))
            continue
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
            unclaimed[p] = max(0, unclaimed.get(p, 0) - n)
            if left[p] == 0:
                del left[p]
        if where:
            first = next(iter(where))
            choices.append(GangChoice(g, where, stake, survival(first, stake), len(whole)))
    return counts, choices


class GangPlan:
    """Spot targets with the partition's gangs whole, each in one pool. The work
    that is not a gang (`want` less the gangs' units) is spread as ever (`spread`,
    keeping what is held); what it leaves of the units held (gangs' nodes still
    booting, idle ones), with the pools' room, is where gangs go (`place_gangs`),
    those already holding a gang's units first. A gang that must run whole
    (`Gang.whole`) and that no pool can hold is left to guaranteed capacity. Without
    gangs, the spread alone."""

    def __init__(
        self,
        gangs: Sequence[Gang],
        held: Mapping[PoolId, int],
        available: Mapping[PoolId, int],
        price: Mapping[PoolId, float],
        spread: Spread,
        survival: Survival,
        loss_weight: float,
        default_s: float,
        guaranteed: float | None = None,
    ) -> None:
        self.gangs, self.held, self.available, self.price = gangs, held, available, price
        self.guaranteed = guaranteed
        self.spread, self.loss_weight, self.default_s = spread, loss_weight, default_s
        self._lasting = survival
        self._survival: dict[tuple[PoolId, float], float] = {}
        self.base: dict[PoolId, int] = {}  # the spread of the work that is not a gang
        self.counts: Counter[PoolId] = Counter()  # units of gangs placed, per pool
        self.choices: list[GangChoice] = []
        self.whole: list[int] = []  # units of gangs left to guaranteed, each whole

    def decide(self, want: int) -> int:
        """Place the gangs within `want` units; returns the units of those that must
        run whole and that no spot pool can hold (guaranteed capacity takes them)."""
        if not self.gangs:
            return 0
        gang_units = sum(g.units for g in self.gangs)
        self.base = self.spread(max(0, want - gang_units), None)
        room: dict[PoolId, int] = {}
        spare: dict[PoolId, int] = {}
        for p in set(self.available) | set(self.held):
            base, held = self.base.get(p, 0), self.held.get(p, 0)
            spare[p] = max(0, held - base)
            room[p] = spare[p] + max(0, self.available.get(p, 0) - max(0, base - held))
        self.counts, self.choices = place_gangs(
            self.gangs, room, self.survival, self.price, self.loss_weight, self.default_s,
            held=spare, guaranteed=self.guaranteed,
        )  # fmt: skip
        self.whole = [c.gang.units for c in self.choices if not c.pools]
        return sum(self.whole)

    def place(self, want: int) -> dict[PoolId, int]:
        """Spot targets for `want` units: the gangs' and the spread's stay."""
        if not self.gangs:
            return self.spread(want, None)
        return self.spread(want, Counter(self.base) + self.counts)

    def batches(self) -> dict[PoolId, int]:
        """Per pool, the most units a gang placed there takes: a gang's nodes there
        in one create (it runs when all of them are up)."""
        out: dict[PoolId, int] = {}
        for c in self.choices:
            for p, n in c.pools.items():
                out[p] = max(out.get(p, 0), n)
        return out

    def survival(self, pool: PoolId, seconds: float) -> float:
        key = (pool, seconds)
        if key not in self._survival:
            self._survival[key] = self._lasting(pool, seconds)
        return self._survival[key]

    def terms(self) -> dict[str, float]:
        if not self.gangs:
            return {}
        return {
            "gangs_pending": float(len(self.gangs)),
            "gangs_placed": float(len(self.choices)),
            "gangs_split": float(sum(len(c.pools) > 1 for c in self.choices)),
            "gangs_guaranteed_units": float(sum(self.whole)),
        }

    def notes(self) -> list[str]:
        shown = [f"gang: {c.describe()}" for c in self.choices[:_GANG_NOTES]]
        if len(self.choices) > _GANG_NOTES:
            shown.append(f"gang: and {len(self.choices) - _GANG_NOTES} more")
        return shown


_GANG_NOTES = 10  # a fleet may place thousands of jobs in a cycle: the first say why
