"""`sco pools`: the latest pool scores, ranked, with why and each pool's exclusion.

Exclusions are shown as of the newest score's time, the clock the state was
written on (wall time in production, trace time after a simulation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from sco.assembly.state import reading
from sco.domain.signals import Exclusion, PoolScore
from sco.domain.times import utc


@dataclass(frozen=True, slots=True)
class PoolRow:
    rank: int | None
    pool: str
    score: PoolScore | None
    exclusion: Exclusion | None
    as_of: float | None

    @property
    def status(self) -> str:
        ex = self.exclusion
        if ex is None or self.as_of is None or not ex.active(self.as_of):
            return "placeable"
        return f"{ex.state} until {utc(ex.until)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pool": self.pool,
            "status": self.status,
            "score": asdict(self.score) if self.score else None,
            "exclusion": asdict(self.exclusion) if self.exclusion else None,
        }


def load_rows(url: str, where: str = "--state") -> list[PoolRow]:
    """Scored pools best first, then pools with an exclusion but no score; `where`
    names the setting or option the URL came from, for the errors."""
    with reading(url, where) as store:
        scores = store.latest_scores()
        exclusions = store.exclusions()
    ranked = sorted(scores.values(), key=lambda s: (-s.value, s.pool))
    as_of = max((s.computed_at for s in ranked), default=None)
    if as_of is None and exclusions:
        as_of = max(e.last_crossing for e in exclusions.values())
    rows = [PoolRow(k, s.pool, s, exclusions.get(s.pool), as_of) for k, s in enumerate(ranked, 1)]
    rows += [
        PoolRow(None, pool, None, ex, as_of)
        for pool, ex in sorted(exclusions.items())
        if pool not in scores
    ]
    return rows


def render(console: Console, rows: list[PoolRow]) -> None:
    if not rows:
        console.print("no pool scores or exclusions yet: the scorer has not run on this state")
        return
    as_of = rows[0].as_of
    table = Table(title=f"pools as of {utc(as_of) if as_of is not None else '—'}")
    cols = ("#", "pool", "score", "hazard/h", "survival", "success", "ready p50", "headroom")
    for col in (*cols, "status"):
        table.add_column(col, justify="left" if col in ("pool", "status") else "right")
    table.columns[1].no_wrap = True
    for r in rows:
        s = r.score
        if s is None:
            table.add_row("—", r.pool, *["—"] * 6, r.status)
            continue
        ready = f"{s.ready_p50_s:.0f} s (n={s.ready_n})" if s.ready_p50_s is not None else "—"
        room = f"{s.headroom:.1f} (n={s.headroom_n})" if s.headroom is not None else "—"
        table.add_row(
            str(r.rank),
            r.pool,
            f"{s.value:.3f}",
            f"{s.hazard_per_h:.3f} ({s.reclaims} in {s.exposure_h:.0f} h)",
            f"{s.survival:.3f}",
            f"{s.success_ratio:.2f} (n={s.attempts})",
            ready,
            room,
            r.status,
        )
    console.print(table)
    console.print("why:")
    for r in rows:
        said = [r.score.why] if r.score else []
        if r.exclusion:
            said.append(_exclusion_why(r.exclusion))
        console.print(f"  {r.rank or '—'}. {r.pool}: {'; '.join(said)}", soft_wrap=True)


def _exclusion_why(ex: Exclusion | None) -> str:
    if ex is None:
        return ""
    return f"last {ex.state}: {ex.reason} (cooldown {ex.cooldown_s:.0f} s)"
