"""A capacity trace played onto a real cloud through the reference reclaimer:
whenever a trace's pool holds fewer instances than sco's spot servers there, the
excess is reclaimed with notice, so a real OpenStack behaves like the spot regions
of the traces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sco.decide.reclaim import Budget
from sco.engine.reclaimer import Noticed, Reclaimer
from sco.lab.traces import Series


@dataclass(frozen=True, slots=True)
class ReplayPool:
    """A trace series played onto a hall and flavor of the cloud."""

    series: Series
    hall: str
    flavor: str


def capacity(series: Series, t: float, pool_size: int) -> int:
    """Instances the trace's pool holds at trace time `t` (0/1 traces: `pool_size`
    each; count traces: `pool_size` per unit too, so 1 keeps the counts)."""
    return series.value_at(t) * pool_size


def replay(
    reclaimer: Reclaimer,
    pools: Sequence[ReplayPool],
    *,
    pool_size: int,
    speed: float,
    notice_s: float,
    budget: Budget,
    stop: Callable[[], bool],
    sleep: Callable[[float], object],
    every_s: float = 1.0,
    on_notice: Callable[[float, ReplayPool, Noticed], None] | None = None,
) -> int:
    """Play the traces from their start until they end or `stop()`, then delete
    what is still under notice at its deadline; trace time runs `speed` times faster
    than the clock. Returns the servers noticed."""
    t0 = reclaimer.clock.now()
    start = max(p.series.start_s for p in pools)
    end = min(p.series.end_s for p in pools)
    noticed = 0
    while not stop():
        t = start + (reclaimer.clock.now() - t0) * speed
        if t >= end:
            break
        for p in pools:
            found = reclaimer.candidates(p.hall, p.flavor)
            held = sum(1 for c in found if not c.noticed)
            excess = held - capacity(p.series, t, pool_size)
            if excess > 0:
                done = reclaimer.request(p.hall, p.flavor, excess, notice_s, budget)
                noticed += len(done.choice.victims) - len(done.failed)
                if on_notice is not None:
                    on_notice(t, p, done)
        reclaimer.sweep()
        sleep(every_s)
    while not stop() and reclaimer.pending():  # the last notices run out
        sleep(every_s)
        reclaimer.sweep()
    # A deadline that passed between the last sweep and the look at what is pending
    # is in neither: one more sweep takes it.
    reclaimer.sweep()
    return noticed
