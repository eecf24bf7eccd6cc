"""The HTML report of a simulated run: summary table and plots, one self-contained file."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from sco.assembly.lab import SimulationResult

DAY_S = 86400.0


def write_report(result: SimulationResult, folder: Path) -> Path:
    """Write `index.html` and `summary.json` into `folder`; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    summary = summary_dict(result)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    zoom_s = min(result.end_s, result.start_s + 3 * DAY_S)
    figures = [
        ("Running capacity against demand", _capacity_figure(result, result.end_s)),
        ("The first days, closer", _capacity_figure(result, zoom_s)),
        ("Holdings against capacity, per pool", _pools_figure(result)),
        ("Cumulative cost against guaranteed-only", _cost_figure(result)),
        ("Pool scores and exclusions over time", _signals_figure(result)),
    ]
    page = _page(result, summary, figures)
    path = folder / "index.html"
    path.write_text(page)
    return path


def summary_dict(result: SimulationResult) -> dict[str, Any]:
    spec = result.spec
    return {
        "traces": str(spec.traces),
        "demand": str(spec.demand),
        "policy": spec.policy_name,
        "seed": spec.seed,
        "cycle_s": spec.cycle_s,
        "cold_start_s": spec.sim.cold_start_s,
        "notice_s": spec.sim.notice_s,
        "start_s": result.start_s,
        "end_s": result.end_s,
        "controller_cycles": result.cycles,
        "fleet_state": {
            "instances_by_state": dict(result.counts.instances_by_state),
            "history_rows": result.counts.history_rows,
            "plans": result.counts.plans,
        },
        "partitions": {n: m.as_dict() for n, m in result.partitions.items()},
        "total": result.aggregate(),
        "signals": {
            "scoring_runs": result.scorings,
            "exclusions": result.exclusions,
            "history_events": result.history_events,
            "history": spec.history_dsn,
            "last_scores": [
                {
                    "pool": s.pool,
                    "value": round(s.value, 4),
                    "hazard_per_h": round(s.hazard_per_h, 4),
                    "exposure_h": round(s.exposure_h, 1),
                    "reclaims": s.reclaims,
                    "survival": round(s.survival, 4),
                    "success_ratio": round(s.success_ratio, 4),
                    "attempts": s.attempts,
                    "why": s.why,
                }
                for s in result.scores
            ],
        },
    }


def _days(t: float, start: float) -> float:
    return (t - start) / DAY_S


def figure_png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _capacity_figure(result: SimulationResult, until_s: float) -> str:
    import matplotlib.pyplot as plt

    series = result.accountant.capacity_series
    fig, axes = plt.subplots(
        len(series), 1, figsize=(12, 3 * len(series)), squeeze=False, layout="constrained"
    )
    for ax, (name, points) in zip(axes[:, 0], series.items(), strict=True):
        pts = [p for p in points if p[0] <= until_s]
        pts = [*pts, (until_s, *pts[-1][1:])] if pts else []
        t = [_days(p[0], result.start_s) for p in pts]
        ax.step(t, [p[1] for p in pts], where="post", lw=0.8, label="running units")
        ax.step(t, [p[2] for p in pts], where="post", lw=1.2, label="target")
        ax.step(t, [p[3] for p in pts], where="post", lw=1.2, ls="--", label="floor")
        m = result.partitions[name]
        ax.set_title(f"{name}: availability {m.availability:.1%}, floor {m.floor_availability:.1%}")
        ax.set_xlabel("day")
        ax.set_ylabel("units")
        ax.legend(loc="upper right", fontsize=8)
    return figure_png(fig)


def _pools_figure(result: SimulationResult) -> str:
    import matplotlib.pyplot as plt

    pools = list(result.region.pools())
    cols = 3
    rows = (len(pools) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(14, 2.4 * rows), squeeze=False, sharex=True, layout="constrained"
    )
    for ax, pool in zip(axes.flat, pools, strict=False):
        pts = result.accountant.pool_series.get(pool.id, [])
        if pts:
            pts = [*pts, (result.end_s, *pts[-1][1:])]
        t = [_days(p[0], result.start_s) for p in pts]
        cap = [min(p[1], 10_000) for p in pts]
        ax.step(t, cap, where="post", lw=0.8, label="capacity")
        ax.step(t, [p[2] for p in pts], where="post", lw=0.8, label="held by sco")
        ax.set_title(f"{pool.id} ({pool.capacity_class})", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(pools) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    return figure_png(fig)


def _cost_figure(result: SimulationResult) -> str:
    import matplotlib.pyplot as plt

    samples = result.accountant.cost_series
    fig, ax = plt.subplots(figsize=(12, 3.5))
    t = [_days(s[0], result.start_s) for s in samples]
    for name in result.partitions:
        ax.plot(t, [s[1][name] for s in samples], label=f"{name}: sco")
        ax.plot(t, [s[2][name] for s in samples], ls="--", label=f"{name}: guaranteed only")
    ax.set_xlabel("day")
    ax.set_ylabel("cumulative cost ($)")
    ax.legend(fontsize=8)
    return figure_png(fig)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _page(result: SimulationResult, summary: dict[str, Any], figures: list[tuple[str, str]]) -> str:
    cols = [
        "availability",
        "floor_availability",
        "served_fraction",
        "below_floor_unit_h",
        "cost_vs_guaranteed",
        "cost",
        "guaranteed_only_cost",
        "reclaims",
        "creates",
        "guaranteed_share",
        "mean_replace_s",
    ]
    head = "".join(f"<th>{c}</th>" for c in ["partition", *cols])
    rows = "".join(
        "<tr><td>"
        + html.escape(n)
        + "</td>"
        + "".join(f"<td>{_fmt(m.as_dict()[c])}</td>" for c in cols)
        + "</tr>"
        for n, m in result.partitions.items()
    )
    days = (result.end_s - result.start_s) / DAY_S
    meta = json.dumps({k: v for k, v in summary.items() if k != "partitions"}, indent=2)
    intro = (
        f"Policy <b>{html.escape(result.spec.policy_name)}</b> on\n"
        f"<code>{html.escape(str(result.spec.traces))}</code>,\n"
        f"{days:.1f} simulated days in {result.wall_s:.1f} s."
    )
    body = f"<table><tr>{head}</tr>{rows}</table>\n{_scores_table(result)}"
    return html_page("sco simulation report", intro, body, figures, meta)


def html_page(title: str, intro: str, body: str, figures: list[tuple[str, str]], meta: str) -> str:
    """One self-contained page: `intro` and `body` as HTML, then each figure (a title
    and a PNG in base64) under its heading, then `meta` as preformatted text."""
    imgs = "".join(
        f"<h2>{html.escape(name)}</h2><img alt='{html.escape(name)}' "
        f"src='data:image/png;base64,{data}'>"
        for name, data in figures
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1300px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
img{{max-width:100%}}pre{{background:#f6f6f6;padding:1em}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{intro}</p>
{body}
{imgs}
<h2>Run</h2><pre>{html.escape(meta)}</pre>
</body></html>
"""


def _scores_table(result: SimulationResult) -> str:
    if not result.scores:
        return ""
    head = "".join(
        f"<th>{c}</th>" for c in ("rank", "pool", "score", "hazard/h", "survival", "success", "why")
    )
    rows = "".join(
        f"<tr><td>{k}</td><td>{html.escape(s.pool)}</td><td>{s.value:.3f}</td>"
        f"<td>{s.hazard_per_h:.3f}</td><td>{s.survival:.3f}</td><td>{s.success_ratio:.2f}</td>"
        f"<td style='text-align:left'>{html.escape(s.why)}</td></tr>"
        for k, s in enumerate(result.scores, 1)
    )
    return f"<h2>Pool ranking at the end ({result.scorings} scoring runs)</h2>" + (
        f"<table><tr>{head}</tr>{rows}</table>"
    )


def _signals_figure(result: SimulationResult) -> str:
    """One row per spot pool: its score over time as a line, exclusions as bands."""
    import matplotlib.pyplot as plt

    pools = sorted(
        {p for _, p, _ in result.timeline.scores} | {e.pool for e in result.timeline.exclusions}
    )
    if not pools:
        pools = [p.id for p in result.region.pools() if p.is_spot]
    fig, axes = plt.subplots(
        len(pools),
        1,
        figsize=(12, 0.9 * len(pools) + 0.6),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    colors = {"excluded": "tab:red", "degraded": "tab:orange"}
    for ax, pool in zip(axes[:, 0], pools, strict=True):
        pts = [(t, v) for t, p, v in result.timeline.scores if p == pool]
        ax.plot([_days(t, result.start_s) for t, _ in pts], [v for _, v in pts], lw=0.9)
        for e in result.timeline.exclusions:
            if e.pool == pool:
                ax.axvspan(
                    _days(e.since, result.start_s),
                    _days(min(e.until, result.end_s), result.start_s),
                    color=colors.get(str(e.state), "grey"),
                    alpha=0.35,
                    lw=0,
                )
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(pool, rotation=0, ha="right", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel(
        "day (line: score = survival x create success; red: excluded, orange: degraded)"
    )
    return figure_png(fig)
