"""Pool history's rules (`sco.ports.PoolHistory`), once, over every implementation:
`ClickHouseHistory` on chDB (the engine in process; a ClickHouse server runs the same
queries) and the lab's `WindowedHistory` (running sums over a fixed window).

`pool_stats(now, window_s)` counts, per pool, over the window ending at `now`:
- exposure: hours instances were ready (from their first `ready`, until they leave:
  noticed, draining, terminating, gone or failed), clipped to the window;
- reclaims: instances with a reclaim notice or a vanished server in the window, each
  once however many it had;
- create attempts (accepted or refused) and successes (accepted) in the window;
- time to ready: from an instance's first event (its record) to its first `ready`,
  for instances ready in the window: the median and how many;
- headroom samples in the window: their mean and how many.
The window holds both its ends: an event at `now - window_s` or at `now` counts.
Events after `now` do not count. A pool with nothing in the window may be left out or
given all zeros: the same answer.

`by_definition` says the same in a few lines of Python; a hand-counted example holds
it and both implementations to the same numbers, and random streams hold both to it.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from sco.adapters.clickhouse.history import ClickHouseHistory
from sco.decide.scorer import PoolStats
from sco.domain.events import CREATE_FAILED, CREATE_OK, RECLAIM_KINDS, LifecycleEvent
from sco.lab.history import WindowedHistory
from sco.ports import PoolHistory

_databases = itertools.count(1)
_LEAVING = frozenset({"noticed", "draining", "terminating", "gone", "failed"})

OpenHistory = Callable[[float], PoolHistory]  # a new, empty history kept for a window


@pytest.fixture(params=["chdb", "windowed"])
def open_history(request: pytest.FixtureRequest) -> Iterator[OpenHistory]:
    opened: list[ClickHouseHistory] = []

    def chdb(_window_s: float) -> PoolHistory:
        path: Path = request.getfixturevalue("chdb_path")
        opened.append(ClickHouseHistory(f"chdb://{path}", database=f"c{next(_databases)}"))
        return opened[-1]

    yield chdb if request.param == "chdb" else WindowedHistory
    for h in opened:
        h.close()


# ---------------------------------------------------------------- events


def step(
    inst: str, n: int, at: float, kind: str, before: str | None, after: str, pool: str = "P"
) -> LifecycleEvent:
    return LifecycleEvent(f"{inst}:{n}", at, "p", pool, inst, kind, "", before, after)


def life(
    inst: str, born: float, ready: float | None = None, pool: str = "P"
) -> list[LifecycleEvent]:
    """Recorded and accepted at `born`, active 10 s later, ready at `ready` (if given)."""
    out = [
        step(inst, 1, born, "recorded", None, "requested", pool),
        step(inst, 2, born, CREATE_OK, "requested", "creating", pool),
    ]
    if ready is not None:
        out += [
            step(inst, 3, born + 10, "server_active", "creating", "active", pool),
            step(inst, 4, ready, "node_joined", "active", "ready", pool),
        ]
    return out


def headroom(key: str, at: float, value: float, pool: str = "P") -> LifecycleEvent:
    return LifecycleEvent(key, at, "", pool, None, "headroom", "", value=value)


# The window: an hour, to NOW; events before LO and after NOW are outside it.
WINDOW_S, NOW = 3600.0, 10_000.0
LO = NOW - WINDOW_S  # 6400

INSIDE = sorted(
    [
        # i1: ready before the window, reclaimed in it (server gone without notice).
        *life("i1", 5000, ready=5600),
        step("i1", 5, 8000, "server_vanished", "ready", "gone"),
        # i2: born and ready in the window (300 s), still ready at NOW.
        *life("i2", 6500, ready=6800),
        # i3: ready in the window (400 s), drained before NOW.
        *life("i3", 7000, ready=7400),
        step("i3", 5, 9000, "drain_requested", "ready", "draining"),
        # i4: a create refused.
        step("i4", 1, 7100, "recorded", None, "requested"),
        step("i4", 2, 7100, CREATE_FAILED, "requested", "failed"),
        # i5: ready in the window (150 s), noticed, then gone: one reclaim.
        *life("i5", 6450, ready=6600),
        step("i5", 5, 9500, "reclaim_notice", "ready", "noticed"),
        step("i5", 6, 9600, "server_vanished", "noticed", "gone"),
        # i6: ready long before the window, never left: the whole window's hour.
        *life("i6", 2900, ready=3000),
        # i7: gone while creating, never ready: a reclaim with no exposure (on ClickHouse
        # 24.12 on, ClickHouseHistory counted it exposed from LO to 7200: found here).
        *life("i7", 7000),
        step("i7", 3, 7200, "server_vanished", "creating", "gone"),
        # Headroom samples: one before the window, two in it.
        headroom("h1", 5000, 100.0),
        headroom("h2", 7000, 2.0),
        headroom("h3", 8000, 4.0),
        # Q: a pool whose instance came and went before the window.
        *life("q1", 900, ready=1000, pool="Q"),
        step("q1", 5, 2000, "server_vanished", "ready", "gone", pool="Q"),
    ],
    key=lambda e: e.at,
)
AFTER = [  # after NOW
    *life("i8", 10_500, ready=10_700),
    headroom("h4", 10_600, 50.0),
    step("i2", 5, 10_800, "server_vanished", "ready", "gone"),
]
# Counted by hand from the events above.
EXPECTED = {
    "P": PoolStats(
        "P",
        exposure_h=(
            (8000 - LO)  # i1, from the window's start
            + (NOW - 6800)  # i2, still ready
            + (9000 - 7400)  # i3, until drained
            + (9500 - 6600)  # i5, until noticed
            + (NOW - LO)  # i6, the whole window
        )
        / 3600,
        reclaims=3,  # i1, i5 (notice and vanish: once), i7
        attempts=5,  # accepted: i2, i3, i5, i7; refused: i4 (i1's and i6's are before)
        successes=4,
        ready_p50_s=300.0,  # i5 150, i2 300, i3 400 (i1 and i6 were ready before)
        ready_n=3,
        headroom=3.0,  # 2 and 4
        headroom_n=2,
    )
}


def by_definition(
    events: Sequence[LifecycleEvent], now: float, window_s: float
) -> dict[str, PoolStats]:
    """pool_stats as the port defines it, the slow way (pools with nothing left out)."""
    lo = now - window_s
    seen = {e.event_id: e for e in events if e.at <= now}
    counted = sorted(seen.values(), key=lambda e: e.at)
    out: dict[str, PoolStats] = {}
    for pool in sorted({e.pool for e in counted}):
        mine = [e for e in counted if e.pool == pool]
        inside = [e for e in mine if e.at >= lo]
        exposure_s, durations = 0.0, []
        for inst in sorted({e.instance for e in mine if e.instance}):
            its = [e for e in mine if e.instance == inst]
            born = next((e.at for e in its if not e.from_state), None)
            ready = next((e.at for e in its if e.to_state == "ready"), None)
            left = next((e.at for e in its if e.to_state in _LEAVING), None)
            if ready is not None:
                exposure_s += max(0.0, min(left if left is not None else now, now) - max(ready, lo))
                if born is not None and ready >= lo:
                    durations.append(ready - born)
        samples = [e.value for e in inside if e.kind == "headroom" and e.value is not None]
        stats = PoolStats(
            pool,
            exposure_h=exposure_s / 3600,
            reclaims=len({e.instance for e in inside if e.kind in RECLAIM_KINDS}),
            attempts=sum(e.kind in (CREATE_OK, CREATE_FAILED) for e in inside),
            successes=sum(e.kind == CREATE_OK for e in inside),
            ready_p50_s=statistics.median(durations) if durations else None,
            ready_n=len(durations),
            headroom=statistics.mean(samples) if samples else None,
            headroom_n=len(samples),
        )
        if stats != PoolStats(pool):
            out[pool] = stats
    return out


def rounded(stats: dict[str, PoolStats]) -> dict[str, PoolStats]:
    """Past float noise (sums taken in another order)."""
    return {
        p: s._replace(
            exposure_h=round(s.exposure_h, 6),
            ready_p50_s=None if s.ready_p50_s is None else round(s.ready_p50_s, 6),
            headroom=None if s.headroom is None else round(s.headroom, 6),
        )
        for p, s in stats.items()
    }


def answered(history: PoolHistory, now: float, window_s: float) -> dict[str, PoolStats]:
    """pool_stats by pool, rounded; pools with nothing left out."""
    stats = history.pool_stats(now, window_s)
    assert [s.pool for s in stats] == sorted({s.pool for s in stats}), "by pool name, once each"
    return rounded({s.pool: s for s in stats if s != PoolStats(s.pool)})


def test_the_definition_counts_the_example_as_counted_by_hand() -> None:
    """The yardstick first: by_definition agrees with the hand count."""
    assert rounded(by_definition(INSIDE + AFTER, NOW, WINDOW_S)) == rounded(EXPECTED)


# ---------------------------------------------------------------- the rules


def test_pool_stats_over_a_window(open_history: OpenHistory) -> None:
    history = open_history(WINDOW_S)
    assert history.load(INSIDE) == len(INSIDE)
    assert answered(history, NOW, WINDOW_S) == rounded(EXPECTED)


def test_an_event_loaded_twice_counts_once(open_history: OpenHistory) -> None:
    """A loader that crashed before committing loads again: the events it loaded count
    once, and `load` says how many it was given (WindowedHistory said how many were new
    to it: found here)."""
    history = open_history(WINDOW_S)
    assert history.load(INSIDE[:20]) == 20
    again = INSIDE[10:]  # ten of them a second time
    assert history.load(again) == len(again)
    assert history.load(INSIDE[-3:]) == 3
    assert answered(history, NOW, WINDOW_S) == rounded(EXPECTED)


def test_events_outside_the_window_do_not_count(open_history: OpenHistory) -> None:
    """Before the window's start, or after its end (`now`): an instance that is gone
    only after `now` was still ready at `now`; one created after `now` was not tried.
    WindowedHistory counted every event it was given, after `now` too (found here)."""
    history = open_history(WINDOW_S)
    history.load(INSIDE + AFTER)
    assert answered(history, NOW, WINDOW_S) == rounded(EXPECTED)
    later = 20_000.0  # an hour that holds only i6, ready all of it, and i8
    assert answered(history, later, WINDOW_S) == {
        "P": PoolStats("P", exposure_h=2.0)  # i6 and i8, each the whole hour
    }


def test_the_window_holds_both_its_ends(open_history: OpenHistory) -> None:
    """A create tried exactly at the window's start and one exactly at `now` both
    count; one a second before the start does not."""
    history = open_history(WINDOW_S)
    history.load(
        [
            step("e0", 1, LO - 1, "recorded", None, "requested"),
            step("e0", 2, LO - 1, CREATE_FAILED, "requested", "failed"),
            step("e1", 1, LO, "recorded", None, "requested"),
            step("e1", 2, LO, CREATE_FAILED, "requested", "failed"),
            step("e2", 1, NOW, "recorded", None, "requested"),
            step("e2", 2, NOW, CREATE_FAILED, "requested", "failed"),
            headroom("hl", LO, 6.0),
            headroom("hn", NOW, 2.0),
        ]
    )
    assert answered(history, NOW, WINDOW_S) == {
        "P": PoolStats("P", attempts=2, headroom=4.0, headroom_n=2)
    }


# ---------------------------------------------------------------- random streams


def random_stream(seed: int, pools: int = 4, instances: int = 300) -> list[LifecycleEvent]:
    """Lifecycles as the controller writes them: refused creates, readiness, reclaims
    with and without notice, drains; headroom samples; by time."""
    rng = random.Random(seed)
    out: list[LifecycleEvent] = []
    for k in range(instances):
        pool, inst = f"P{rng.randrange(pools)}", f"i{k}"
        t = rng.uniform(0, 40 * 3600)
        if rng.random() < 0.2:
            out += [
                step(inst, 1, t, "recorded", None, "requested", pool),
                step(inst, 2, t, CREATE_FAILED, "requested", "failed", pool),
            ]
            continue
        ready = t + rng.uniform(60, 400)
        out += life(inst, t, ready=ready, pool=pool)
        end = ready + rng.expovariate(1 / 20000)
        how = rng.choice(["vanished", "notice", "drain", "live"])
        if how == "vanished":
            out.append(step(inst, 5, end, "server_vanished", "ready", "gone", pool))
        elif how == "notice":
            out.append(step(inst, 5, end, "reclaim_notice", "ready", "noticed", pool))
            out.append(step(inst, 6, end + 90, "server_vanished", "noticed", "gone", pool))
        elif how == "drain":
            out.append(step(inst, 5, end, "drain_requested", "ready", "draining", pool))
    for k in range(150):
        out.append(headroom(f"h{k}", rng.uniform(0, 40 * 3600), rng.randrange(9), f"P{k % pools}"))
    return sorted(out, key=lambda e: e.at)


@pytest.mark.parametrize("seed", [7, 8])
def test_random_streams_count_by_the_definition(open_history: OpenHistory, seed: int) -> None:
    """Loaded as a loader does, what the log delivered up to each `now` (some of it
    delivered again), asked as the scorer does, at each `now` in turn."""
    events = random_stream(seed)
    window_s = 6 * 3600.0
    history = open_history(window_s)
    loaded = 0
    for now in [3600.0 * k for k in range(2, 48, 5)]:
        batch = [e for e in events[loaded:] if e.at <= now]
        history.load(batch + batch[:3])
        loaded += len(batch)
        assert answered(history, now, window_s) == rounded(by_definition(events, now, window_s))
