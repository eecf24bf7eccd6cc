"""Which spot servers a reclaimer takes back, and why: the cloud operator's side.

A guaranteed tenant needs `count` servers' worth of a hall and flavor back. The
reclaimer gives notice to spot servers there, least harm first:

1. servers whose node is not serving yet (nothing runs there);
2. servers of partitions holding more than their plan's target;
3. the youngest (the least work lost, and the least history of being stable).

A disruption budget caps each partition's servers under notice at once (a count,
a fraction of what it holds, or both), counted over the whole partition: every
hall, flavor and class it holds servers in, not only the pool asked for, since a
partition noticed in one hall is disrupted no less for being asked in another.
What the budget keeps from being taken is reported as short, never taken anyway.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    server_id: str
    partition: str
    created_at: float
    serving: bool  # its node is in its scheduler (READY)
    noticed: bool  # already under notice


@dataclass(frozen=True, slots=True)
class Standing:
    """One partition's servers across the cloud, and how many are under notice."""

    held: int = 0
    noticed: int = 0


@dataclass(frozen=True, slots=True)
class Budget:
    max_noticed: int | None = None  # per partition, servers under notice at once
    max_fraction: float | None = None  # per partition, of the servers it holds

    def room(self, held: int, noticed: int) -> int:
        caps = []
        if self.max_noticed is not None:
            caps.append(self.max_noticed)
        if self.max_fraction is not None:
            caps.append(math.floor(self.max_fraction * held))
        return max(0, min(caps) - noticed) if caps else held


@dataclass(frozen=True, slots=True)
class Victim:
    server_id: str
    partition: str
    why: str


@dataclass(frozen=True, slots=True)
class Choice:
    victims: tuple[Victim, ...]
    short: int  # what the budget (or the servers there) kept from being taken
    held_back: Mapping[str, int]  # partition -> servers the budget kept


def choose(
    candidates: Sequence[Candidate],
    count: int,
    over_target: Mapping[str, int],
    budget: Budget,
    standing: Mapping[str, Standing],
) -> Choice:
    """Up to `count` victims among `candidates` (the spot servers of one hall and
    flavor); `over_target` is how many servers each partition holds above its plan,
    `standing` what each holds in the whole cloud, which the budget is counted on.
    A partition's standing never counts less than its candidates show."""
    held = Counter(c.partition for c in candidates)
    noticed = Counter(c.partition for c in candidates if c.noticed)
    whole = {
        p: Standing(
            max(n, standing.get(p, Standing()).held),
            max(noticed[p], standing.get(p, Standing()).noticed),
        )
        for p, n in held.items()
    }
    room = {p: budget.room(w.held, w.noticed) for p, w in whole.items()}
    above = dict(over_target)

    def harm(c: Candidate) -> tuple[bool, bool, float]:
        return (c.serving, above.get(c.partition, 0) <= 0, -c.created_at)

    victims: list[Victim] = []
    kept: Counter[str] = Counter()
    for c in sorted((c for c in candidates if not c.noticed), key=harm):
        if len(victims) == count:
            break
        if room[c.partition] <= 0:
            kept[c.partition] += 1
            continue
        room[c.partition] -= 1
        why = _why(c, above.get(c.partition, 0))
        if above.get(c.partition, 0) > 0:
            above[c.partition] -= 1
        victims.append(Victim(c.server_id, c.partition, why))
    return Choice(tuple(victims), count - len(victims), dict(kept))


def _why(c: Candidate, above: int) -> str:
    parts = ["not serving yet" if not c.serving else "serving"]
    if above > 0:
        parts.append(f"its partition holds {above} above target")
    parts.append("youngest left")
    return ", ".join(parts)
