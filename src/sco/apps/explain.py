"""`sco explain PARTITION`: the current plan, pool by pool, with its reasons.

What the planner weighed for each pool (hazard terms, price, crowding,
stickiness, per instance-hour: the pool's cost is their sum), what it holds
and may still take, what kept it out (excluded, degraded, no room), and the
partition's own figures (spare, floor need, cold start, notice). Then what
the partition holds, by state, the exclusions in force, and what happened in the
last hour (reclaims, replacements, drains).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from sco.apps.happened import WINDOW_S, Happened, happened
from sco.assembly.state import StateUnreadable, reading
from sco.domain.plans import Plan
from sco.domain.signals import Exclusion
from sco.domain.times import utc


class NothingToExplain(ValueError):
    """No plan for the partition (a name misspelt, or no controller has run)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    plan: Plan
    held: dict[str, int]  # instances by state
    exclusions: dict[str, Exclusion]
    intent: str | None
    lately: Happened  # the last hour's reclaims, replacements, drains

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        return {
            "partition": p.partition,
            "generation": p.generation,
            "created_at": p.created_at,
            "spot": dict(p.spot),
            "guaranteed": dict(p.guaranteed),
            "notes": list(p.notes),
            "terms": dict(p.terms),
            "pools": {pool: why.to_json() for pool, why in sorted(p.pools.items())},
            "held": self.held,
            "intent": self.intent,
            "last_hour": self.lately.as_dict(),
            "exclusions": {
                pool: {"state": str(ex.state), "until": ex.until, "reason": ex.reason}
                for pool, ex in sorted(self.exclusions.items())
            },
        }


def explain(url: str, partition: str, now: float) -> Explanation:
    try:
        with reading(url, _where(url)) as store:
            plan = store.latest_plan(partition)
            if plan is None:
                raise NothingToExplain(f"no plan for partition {partition!r} in {_where(url)}")
            held = Counter(str(i.state) for i in store.instances(partition))
            exclusions = {
                pool: ex for pool, ex in store.exclusions().items() if ex.active(plan.created_at)
            }
            intent = store.intents().get(partition)
            since = now - WINDOW_S
            lately = happened(store.history_since(since), since).get(partition, Happened(since))
    except StateUnreadable as e:
        raise NothingToExplain(str(e)) from None
    return Explanation(plan, dict(held), exclusions, intent, lately)


def _where(url: str) -> str:
    return url.rsplit("@", maxsplit=1)[-1]


# The terms in the order an operator reads them: what the pool is, then what placing
# there costs.
_TERM_ORDER = (
    "age",
    "history",
    "recent_reclaims",
    "full_pool",
    "degraded",
    "storm",
    "price",
    "crowding",
)


def render(console: Console, e: Explanation) -> None:
    p = e.plan
    console.print(
        f"[bold]{p.partition}[/]: plan generation {p.generation}"
        + (f" — [red]intent: {e.intent}[/]" if e.intent else "")
    )
    for note in p.notes:
        console.print(f"  why: {note}")
    if p.terms:
        console.print(
            "  partition: " + ", ".join(f"{k} {_num(v)}" for k, v in sorted(p.terms.items()))
        )
    table = Table(title="pools (terms per instance-hour; cost = their sum)")
    for col in ("pool", "class", "target", "held", "room", "price/h", "cost", "terms", "flags"):
        table.add_column(
            col, justify="left" if col in ("pool", "class", "terms", "flags") else "right"
        )
    spot = set(p.spot)
    for pool, why in sorted(p.pools.items(), key=lambda kv: (kv[0] not in spot, kv[0])):
        terms = {k: v for k, v in why.terms.items() if v}
        ordered = sorted(terms, key=lambda k: (_TERM_ORDER.index(k) if k in _TERM_ORDER else 99, k))
        cost = sum(v for k, v in why.terms.items() if k != "stickiness")
        table.add_row(
            pool,
            "guaranteed" if pool in p.guaranteed or not why.terms else "spot",
            str(why.target),
            str(why.held),
            str(why.available),
            f"{why.price_per_h:.3f}",
            f"{cost:.3f}" if why.terms else "",
            ", ".join(f"{k} {_num(terms[k])}" for k in ordered),
            ", ".join(why.flags),
        )
    console.print(table)
    console.print(
        "holds: " + (", ".join(f"{n} {s}" for s, n in sorted(e.held.items())) or "nothing")
    )
    for pool, ex in sorted(e.exclusions.items()):
        console.print(f"exclusion: {pool} {ex.state} until {utc(ex.until)} ({ex.reason})")
    lately = e.lately.sentence()
    console.print(f"last hour: [red]{lately}[/]" if e.lately.reclaims else f"last hour: {lately}")


def _num(v: float) -> str:
    return f"{v:.3g}"
