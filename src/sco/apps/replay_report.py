"""The HTML report of `sco replay`: the policies side by side, and plots of what the
jobs' users felt (one self-contained file, and the JSON beside it)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from sco.apps.report import figure_png, html_page
from sco.assembly.lab import Replayed

HOUR_S = 3600.0
COLUMNS = (
    "jobs_completed",
    "jobs_failed",
    "jobs_unfinished",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p99_s",
    "bounded_slowdown",
    "requeues",
    "restart_wait_p95_s",
    "lost_node_hours",
    "service_unavailable_share",
    "utilisation",
    "wide_jobs_multi_pool",
    "jobs_met_reclaim",
    "cost",
    "cost_vs_guaranteed",
)


def write_replay_report(runs: list[Replayed], about: dict[str, Any], folder: Path) -> Path:
    """Write `index.html` and `summary.json` into `folder`; returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"policies": {r.policy: r.outcomes for r in runs}, **about}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    figures = [
        ("The front: work lost, wait (p95) and cost, policy by policy", _front(runs)),
        ("Wait in the queue: the share of jobs that waited at most so long", _waits(runs)),
        ("Jobs pending, and nodes up (solid) and busy (dotted)", _queue(runs)),
        ("Work lost with nodes, cumulative", _lost(runs)),
    ]
    path = folder / "index.html"
    path.write_text(_page(runs, about, figures))
    return path


def _hours(t: float, start: float) -> float:
    return (t - start) / HOUR_S


FRONT = (
    ("lost_node_hours", "node-hours lost"),
    ("wait_p95_s", "wait p95 (s)"),
    ("cost", "cost"),
)


def _front(runs: list[Replayed]) -> str:
    """What a user weighs, side by side: one panel per measure, a bar per policy."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FRONT), figsize=(11, 3.5))
    names = [r.policy for r in runs]
    for ax, (key, label) in zip(axes, FRONT, strict=True):
        values = [float(r.outcomes.get(key) or 0.0) for r in runs]
        ax.bar(range(len(runs)), values, color=[f"C{k}" for k in range(len(runs))])
        ax.set_xticks(range(len(runs)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
    fig.tight_layout()
    return figure_png(fig)


def _waits(runs: list[Replayed]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for r in runs:
        n = len(r.waits_s)
        if n:
            ax.step(
                [max(w, 1.0) for w in r.waits_s], [(k + 1) / n for k in range(n)], label=r.policy
            )
    ax.set_xscale("log")
    ax.set_xlabel("wait (s, log)")
    ax.set_ylabel("share of jobs")
    ax.legend()
    return figure_png(fig)


def _queue(runs: list[Replayed]) -> str:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in runs:
        ts = [_hours(s[0], r.start_s) for s in r.samples]
        top.plot(ts, [s[1] for s in r.samples], label=r.policy)
        line = bottom.plot(ts, [s[2] for s in r.samples], label=r.policy)[0]
        bottom.plot(ts, [s[3] for s in r.samples], linestyle=":", color=line.get_color())
    top.set_ylabel("jobs (pods) pending")
    top.legend()
    bottom.set_ylabel("nodes")
    bottom.set_xlabel("hours")
    return figure_png(fig)


def _lost(runs: list[Replayed]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.5))
    for r in runs:
        total, xs, ys = 0.0, [0.0], [0.0]
        for at, node_s in r.lost:
            total += node_s / HOUR_S
            xs.append(_hours(at, r.start_s))
            ys.append(total)
        if r.samples:
            xs.append(_hours(r.samples[-1][0], r.start_s))
            ys.append(total)
        ax.step(xs, ys, where="post", label=r.policy)
    ax.set_xlabel("hours")
    ax.set_ylabel("node-hours lost")
    ax.legend()
    return figure_png(fig)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.0f}"
    return "-" if v is None else html.escape(str(v))


def _page(runs: list[Replayed], about: dict[str, Any], figures: list[tuple[str, str]]) -> str:
    shown = [c for c in COLUMNS if any(c in r.outcomes for r in runs)]
    head = "".join(f"<th>{c}</th>" for c in ["policy", *shown])
    rows = "".join(
        f"<tr><td>{html.escape(r.policy)}</td>"
        + "".join(f"<td>{_cell(r.outcomes.get(c))}</td>" for c in shown)
        + "</tr>"
        for r in runs
    )
    intro = "What the jobs' users felt under each policy, on the same workload, trace and seed."
    meta = json.dumps(about, indent=2, sort_keys=True)
    body = f"<table><tr>{head}</tr>{rows}</table>"
    return html_page("sco replay report", intro, body, figures, meta)
