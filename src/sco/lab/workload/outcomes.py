"""What a replay's users felt, in numbers both kinds of workload report alike."""

from __future__ import annotations

import math

TAU_S = 10.0  # bounded slowdown's floor on a job's run time


def pct(ordered: list[float], q: float) -> float | None:
    """The nearest-rank percentile of sorted values."""
    if not ordered:
        return None
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1)


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def bounded_slowdown(runs: list[tuple[float, float]]) -> float | None:
    """Mean over (time from submission to end, run time) of each completed job of
    that time over its run time (at least `TAU_S`), at least 1."""
    if not runs:
        return None
    return round(sum(max(1.0, took / max(run, TAU_S)) for took, run in runs) / len(runs), 3)
