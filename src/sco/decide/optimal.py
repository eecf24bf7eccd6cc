"""The omniscient bound: the cheapest schedule that meets the target at every tick.

Knowing every zone's capacity at every tick, choose how many spot instances to
hold per zone and tick (x) and how many on-demand (y). An instance serves once
it has been held for a cold start, so the ready count of a zone at tick k is at
most the fewest it held over ticks k-c..k (c = cold start in ticks); the oldest
survive because reclaims and terminations take the newest first. A MILP, solved
with HiGHS:

    min  sum_k>=L  tick * (p_spot * sum_z x[z,k] + p_od * y[k])
    s.t. x[z,k] <= cap[z,k]
         r[z,k] <= x[z,j],  s[k] <= y[j]          for j in k-c..k  (0 when k < c)
         sum_z r[z,k] + s[k] >= target            for k >= L (counted ticks)
         x, y integer >= 0;  r, s >= 0

Ticks before L are the lead-in: free, so the schedule may start instances early.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


class NoSolution(RuntimeError):
    """HiGHS found no schedule (it always exists when on-demand is unbounded)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    spot: tuple[tuple[int, ...], ...]  # [zone][tick]
    on_demand: tuple[int, ...]  # [tick]
    cost: float  # the objective, in price x hours
    gap: float  # HiGHS's relative MIP gap at the end


def solve(
    caps: Sequence[Sequence[int]],
    target: int | Sequence[int],
    cold_ticks: int,
    counted_from: int,
    tick_s: float,
    spot_price: float | Sequence[Sequence[float]],
    od_price: float,
    time_limit_s: float = 60.0,
    integral: bool = True,
) -> Schedule:
    """The cheapest schedule for capacities `caps[zone][tick]` (see the module text).

    `target` and `spot_price` may vary by tick (`spot_price[zone][tick]`). With
    `integral=False` the relaxation is solved: a bound, fast at fleet scale."""
    import highspy  # optional: the `eval` extra
    import numpy as np

    zones = len(caps)
    ticks = len(caps[0]) if zones else 0
    if any(len(c) != ticks for c in caps):
        raise ValueError("every zone needs a capacity for every tick")
    targets = [target] * ticks if isinstance(target, int) else list(target)
    if len(targets) != ticks:
        raise ValueError("a per-tick target needs a value for every tick")
    prices = (
        [[float(spot_price)] * ticks for _ in range(zones)]
        if isinstance(spot_price, int | float)
        else spot_price
    )
    top = max(targets, default=0)
    # Columns: x[z,k], r[z,k] for each zone, then y[k], s[k].
    n_x = zones * ticks

    def x(z: int, k: int) -> int:
        return z * ticks + k

    def r(z: int, k: int) -> int:
        return n_x + z * ticks + k

    y0, s0 = 2 * n_x, 2 * n_x + ticks
    n = 2 * n_x + 2 * ticks
    hours = tick_s / 3600
    cost = np.zeros(n)
    upper = np.full(n, highspy.kHighsInf)
    for z in range(zones):
        for k in range(ticks):
            upper[x(z, k)] = min(caps[z][k], top + 1)
            if k >= counted_from:
                cost[x(z, k)] = prices[z][k] * hours
            if k < cold_ticks:
                upper[r(z, k)] = 0
    for k in range(ticks):
        upper[y0 + k] = top
        if k >= counted_from:
            cost[y0 + k] = od_price * hours
        if k < cold_ticks:
            upper[s0 + k] = 0
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    row_upper: list[float] = []

    def row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        i = len(lower)
        for c, v in entries:
            rows.append(i)
            cols.append(c)
            vals.append(v)
        lower.append(lo)
        row_upper.append(hi)

    inf = highspy.kHighsInf
    for k in range(cold_ticks, ticks):
        for j in range(k - cold_ticks, k + 1):
            for z in range(zones):
                row([(r(z, k), 1.0), (x(z, j), -1.0)], -inf, 0.0)
            row([(s0 + k, 1.0), (y0 + j, -1.0)], -inf, 0.0)
    for k in range(counted_from, ticks):
        row([*((r(z, k), 1.0) for z in range(zones)), (s0 + k, 1.0)], float(targets[k]), inf)

    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(lower)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = upper
    lp.row_lower_ = np.array(lower)
    lp.row_upper_ = np.array(row_upper)
    order = np.lexsort((np.array(rows), np.array(cols)))
    col_idx = np.array(cols)[order]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(col_idx, np.arange(n + 1)).astype(np.int32)
    lp.a_matrix_.index_ = np.array(rows, dtype=np.int32)[order]
    lp.a_matrix_.value_ = np.array(vals)[order]
    integer = highspy.HighsVarType.kInteger
    continuous = highspy.HighsVarType.kContinuous
    if integral:
        lp.integrality_ = [integer if c < n_x or y0 <= c < s0 else continuous for c in range(n)]
    with highs_banner_to_stderr():
        h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 1e-4)
    h.passModel(lp)
    h.run()
    values = list(h.getSolution().col_value)
    if len(values) != n:
        raise NoSolution(f"HiGHS: {h.modelStatusToString(h.getModelStatus())}")
    info = h.getInfo()
    gap = float(info.mip_gap) if integral else 0.0
    spot = tuple(tuple(round(values[x(z, k)]) for k in range(ticks)) for z in range(zones))
    od = tuple(round(values[y0 + k]) for k in range(ticks))
    return Schedule(spot, od, float(info.objective_function_value), gap)


@contextmanager
def highs_banner_to_stderr() -> Iterator[None]:
    """HiGHS prints a banner to the process's stdout when a solver is made (before
    any option can silence it), which would corrupt `--json` output: send the C-level
    stdout to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # what the C library buffered goes to stderr
        os.dup2(saved, 1)
        os.close(saved)
