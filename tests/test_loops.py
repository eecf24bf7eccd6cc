"""Partition loops keep phases apart: loops started together (a replica taking its
leases) must not list the cloud together at every interval (sco.engine.loops)."""

from __future__ import annotations

import itertools
import threading

from hypothesis import given
from hypothesis import strategies as st

from sco.engine.cycle import CycleReport
from sco.engine.loops import PartitionLoops, next_start, spread_phase


def test_phases_of_loops_started_together_are_spread_over_the_interval() -> None:
    picked: list[float] = []
    for _ in range(4):
        picked.append(spread_phase(picked, 8.0))
    assert picked == [0.0, 4.0, 2.0, 6.0]


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=20),
    st.floats(min_value=0.01, max_value=600),
)
def test_a_new_phase_is_in_the_widest_gap(taken: list[float], period: float) -> None:
    phase = spread_phase(taken, period)
    assert 0 <= phase < period
    if taken:
        ring = sorted(t % period for t in taken)
        widest = max([b - a for a, b in itertools.pairwise(ring)] + [ring[0] + period - ring[-1]])

        def gap(t: float) -> float:
            d = abs(phase - t % period)
            return min(d, period - d)

        assert min(gap(t) for t in taken) >= widest / 2 - 1e-6 * period


@given(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(min_value=0, max_value=1e3),
    st.floats(min_value=0.01, max_value=600),
)
def test_the_next_start_is_on_the_phase_within_one_interval(
    now: float, phase: float, period: float
) -> None:
    at = next_start(now, phase, period)
    assert now < at <= now + period * (1 + 1e-9) + 1e-6
    k = (at - phase) / period
    assert abs(k - round(k)) < 1e-6


class _Held:
    """A controller whose first cycle waits until the test lets it go."""

    def __init__(self, name: str, go: threading.Event) -> None:
        self.name = name
        self.go = go

    def cycle(self) -> CycleReport:
        self.go.wait(30)
        return CycleReport(self.name, 0.0, 0, 0, 0, 0, 0)


def test_a_replica_gives_each_loop_it_starts_a_phase_of_its_own() -> None:
    go = threading.Event()
    loops = PartitionLoops(6.0)
    try:
        for name in ("a", "b", "c"):
            assert loops.start(name, _Held(name, go))  # type: ignore[arg-type]
        phases = {n: loop.phase for n, loop in loops._loops.items()}
        assert phases == {"a": 0.0, "b": 3.0, "c": 1.5}
        loops.stop("b")
        go.set()
        loops._loops["b"].thread.join(10)  # type: ignore[union-attr]
        assert loops.start("d", _Held("d", go))  # type: ignore[arg-type]
        assert loops._loops["d"].phase == 3.75  # the widest gap once b has gone
    finally:
        go.set()
        loops.stop_all(wait_s=10)
