"""Whole runs on small traces, checked against hand-computed availability and cost."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from sco.adapters.clickhouse.history import HistoryUnavailable
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.common import bundled
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.lab.region import SimConfig
from sco.lab.simulation import Simulation, SimulationSpec
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.openstack_stack import free_port


def _region(folder: Path, values: list[int], quota: int = 0) -> Path:
    """One spot pool at $1/h, guaranteed at $3/h, one hall, 600 s ticks."""
    write_json_trace(folder, "a", values, gap_s=600)
    write_yaml(
        folder / "region.yaml",
        {
            "flavor": "gpu",
            "halls": 1,
            "spot_price_per_h": 1.0,
            "guaranteed_price_per_h": 3.0,
            "guaranteed_quota_per_hall": quota,
        },
    )
    return folder


def _demand(path: Path, target: int, floor: int) -> Path:
    return write_yaml(
        path,
        {
            "partitions": [
                {
                    "name": "p",
                    "kind": "kubernetes",
                    "target_units": target,
                    "floor_units": floor,
                    "max_units": target,
                },
            ]
        },
    )


# No spare spot: the hand-computed cases below follow instances one by one.
EXACT = ScoPolicy(HedgeConfig(max_spare=0))


def _run(
    tmp_path: Path, traces: Path, demand: Path, resync_s: float | None = None, **sim: float
) -> dict[str, float]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = SimulationSpec(
        traces=traces,
        demand=demand,
        policy=EXACT,
        sim=SimConfig(**sim),  # type: ignore[arg-type]
        idle_resync_s=resync_s,
    )
    result = Simulation.build(spec).run(sqlite_url(tmp_path / "state.db"))
    return result.partitions["p"].as_dict()  # type: ignore[return-value]


def test_steady_pool(tmp_path: Path) -> None:
    # t=0: create 2; ACTIVE and joined at 120 s; the trace ends at 2400 s.
    m = _run(tmp_path, _region(tmp_path / "t", [2, 2, 2, 2]), _demand(tmp_path / "d.yaml", 2, 0))
    assert m["availability"] == pytest.approx((2400 - 120) / 2400)
    assert m["cost"] == pytest.approx(2 * 2400 / 3600 * 1.0)
    assert m["guaranteed_only_cost"] == pytest.approx(2 * 2400 / 3600 * 3.0)
    assert m["cost_vs_guaranteed"] == pytest.approx(1 / 3)
    assert (m["creates"], m["reclaims"]) == (2, 0)


def test_reclaim_and_replacement(tmp_path: Path) -> None:
    # 600 s: capacity 1, the newest server is reclaimed; no room to replace.
    # 1200 s: capacity 2 again, a replacement is created; ready at 1320 s.
    m = _run(tmp_path, _region(tmp_path / "t", [2, 1, 2, 2]), _demand(tmp_path / "d.yaml", 2, 0))
    assert m["availability"] == pytest.approx(((600 - 120) + (2400 - 1320)) / 2400)
    # Server-seconds: 2400 + 600 + 1200, at $1/h.
    assert m["cost"] == pytest.approx(4200 / 3600)
    assert (m["creates"], m["reclaims"]) == (3, 1)
    assert m["mean_replace_s"] == pytest.approx(1320 - 600)
    # Units running up to the target: 2 x 480 + 1 x 720 + 2 x 1080 of 2 x 2400.
    assert m["served_fraction"] == pytest.approx(3840 / 4800)
    assert m["below_floor_unit_h"] == 0.0


def test_event_driven_cycles_react_to_the_same_events(tmp_path: Path) -> None:
    # Idle cycles skipped: the reclaim at 600 s and the room at 1200 s are region
    # events, so the replacement is created and ready exactly as with every cycle.
    traces = _region(tmp_path / "t", [2, 1, 2, 2])
    demand = _demand(tmp_path / "d.yaml", 2, 0)
    every = _run(tmp_path / "a", traces, demand)
    paced = _run(tmp_path / "b", traces, demand, resync_s=900.0)
    assert paced == every


def test_signals_run_on_the_simulated_clock(tmp_path: Path) -> None:
    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-4node"),
        demand=bundled("demand", "default.yaml"),
        duration_s=6 * 3600,
        idle_resync_s=300.0,
    )
    result = Simulation.build(spec).run(sqlite_url(tmp_path / "s.db"))
    # Every 5 simulated minutes, plus the last word at the end.
    assert result.scorings == 6 * 12 + 1
    assert result.scores
    assert all(0.0 <= s.value <= 1.0 for s in result.scores)
    assert sum(s.exposure_h for s in result.scores) > 0
    assert {p for _, p, _ in result.timeline.scores} == {s.pool for s in result.scores}
    store = SqlFleetStore(sqlite_url(tmp_path / "s.db"))
    assert set(store.latest_scores()) == {s.pool for s in result.scores}
    store.close()


def test_floor_kept_with_guaranteed_then_given_back(tmp_path: Path) -> None:
    # Floor 2 and a guaranteed quota. t=0: 2 spot are created; guaranteed launched now
    #   would be ready no sooner, so none is. Ready at 120 s.
    # 600 s: one spot reclaimed and no room to replace it: 1 guaranteed, ready at 720 s.
    # 1200 s: room again: a spot replacement, ready at 1320 s; the guaranteed stays
    #   until then, then drains by 1380 s (controller drain_s 60) and is gone at 1385 s.
    m = _run(
        tmp_path, _region(tmp_path / "t", [2, 1, 2, 2], quota=4), _demand(tmp_path / "d.yaml", 2, 2)
    )
    assert m["availability"] == pytest.approx((2400 - 120 - 120) / 2400)
    assert m["floor_availability"] == pytest.approx((2400 - 120 - 120) / 2400)
    spot = (600 + 2400 + 1200) / 3600 * 1.0
    guaranteed = (1385 - 600) / 3600 * 3.0
    assert m["cost"] == pytest.approx(spot + guaranteed)
    assert (m["creates"], m["reclaims"]) == (4, 1)
    assert m["mean_replace_s"] == pytest.approx(720 - 600)
    # Below the floor of 2: by 2 units for 120 s (booting), by 1 for 120 s (reclaimed).
    assert m["below_floor_unit_h"] == pytest.approx(360 / 3600)
    assert m["served_fraction"] == pytest.approx((4800 - 360) / 4800)


def test_notice_lets_replacement_start_before_the_reclaim(tmp_path: Path) -> None:
    # Pools a and b hold one instance each; a drops to 0 at 1200 s. Unwarned, the
    # replacement in b is created at 1200 s and ready at 1320 s. With 300 s notice it is
    # created at 900 s and ready at 1020 s, before the noticed node stops serving.
    traces = _region(tmp_path / "t", [1, 1, 0, 1])
    write_json_trace(traces, "b", [2, 2, 2, 2], gap_s=600)
    demand = _demand(tmp_path / "d.yaml", 2, 0)
    blind = _run(tmp_path / "a", traces, demand)
    warned = _run(tmp_path / "b", traces, demand, notice_s=300.0)
    assert blind["availability"] == pytest.approx((2400 - 120 - 120) / 2400)
    assert warned["availability"] == pytest.approx((2400 - 120) / 2400)
    assert blind["reclaims"] == warned["reclaims"] == 1
    assert blind["mean_replace_s"] == pytest.approx(120)
    assert warned["mean_replace_s"] == pytest.approx(120)


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-4node"),
        demand=bundled("demand", "default.yaml"),
        duration_s=6 * 3600,
        sim=SimConfig(error_rate=0.05, timeout_rate=0.05, seed=7),
    )
    a = Simulation.build(spec).run(sqlite_url(tmp_path / "a.db"))
    b = Simulation.build(spec).run(sqlite_url(tmp_path / "b.db"))
    assert a.partitions == b.partitions
    assert a.counts == b.counts


@pytest.mark.parametrize("notice_s", [0.0, 300.0])
def test_the_in_memory_twins_give_what_sqlite_gives(tmp_path: Path, notice_s: float) -> None:
    """The lab runs on the in-memory twins of fleet state and the event log unless a
    database is named: the same run, with faults, to the last digit."""
    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-9zone"),
        demand=bundled("demand", "demo.yaml"),
        duration_s=12 * 3600,
        sim=SimConfig(error_rate=0.05, timeout_rate=0.05, seed=11, notice_s=notice_s),
    )
    on_sql = Simulation.build(spec).run(sqlite_url(tmp_path / "a.db"))
    in_memory = Simulation.build(spec).run()
    assert in_memory.outcome() == on_sql.outcome()
    assert in_memory.counts.history_rows > 100


def test_every_transition_is_recorded_and_legal(tmp_path: Path) -> None:
    from sco.domain.lifecycle import EDGES, State, Trigger

    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-4node"),
        demand=bundled("demand", "default.yaml"),
        duration_s=24 * 3600,
        sim=SimConfig(error_rate=0.02, timeout_rate=0.02, seed=3),
    )
    Simulation.build(spec).run(sqlite_url(tmp_path / "s.db"))
    store = SqlFleetStore(sqlite_url(tmp_path / "s.db"))
    rows = store.history()
    assert rows
    last: dict[str, str] = {}
    for r in rows:
        if r.from_state is None:
            assert r.instance_id not in last
        else:
            assert last[r.instance_id] == r.from_state
            assert r.trigger is not None
            assert EDGES[(State(r.from_state), Trigger(r.trigger))] is State(r.to_state)
        last[r.instance_id] = r.to_state
    store.close()


def test_a_warm_up_counts_neither_availability_nor_cost(tmp_path: Path) -> None:
    """The fleet fills during the first 600 s (ready at 120 s); counting starts at 600 s,
    so the window is fully available and costs its 1,800 s alone."""
    traces = _region(tmp_path / "t", [2, 2, 2, 2])
    spec = SimulationSpec(
        traces=traces,
        demand=_demand(tmp_path / "d.yaml", 2, 2),
        policy=EXACT,
        start_offset_s=600.0,
        warmup_s=600.0,
    )
    result = Simulation.build(spec).run(sqlite_url(tmp_path / "state.db"))
    m = result.partitions["p"]
    assert result.start_s == pytest.approx(result.end_s - 1800.0)
    assert (m.availability, m.floor_availability) == (1.0, 1.0)
    assert m.cost == pytest.approx(2 * 1800 / 3600)
    with pytest.raises(ValueError, match="warmup_s"):
        Simulation.build(SimulationSpec(traces=traces, demand=spec.demand, warmup_s=60.0))


def test_event_driven_cycles_react_to_a_notice_when_it_comes(tmp_path: Path) -> None:
    """With a 120 s notice and a 120 s cold start, an event-driven controller starts the
    replacement at the notice itself (not at the next 30 s tick): with a cycle of 600 s
    the fixed grid would leave the partition short, the events do not."""
    traces = _region(tmp_path / "t", [2, 2, 1, 1], quota=2)
    demand = _demand(tmp_path / "d.yaml", 2, 2)

    def run(resync: float | None, folder: str) -> float:
        (tmp_path / folder).mkdir()
        spec = SimulationSpec(
            traces=traces,
            demand=demand,
            policy=EXACT,
            cycle_s=600.0,
            sim=SimConfig(notice_s=150.0, drain_s=0.0),
            idle_resync_s=resync,
        )
        r = Simulation.build(spec).run(sqlite_url(tmp_path / folder / "state.db"))
        return r.partitions["p"].below_floor_unit_h

    # Both start empty: 2 units short for the first boot's 120 s. The grid ticks at 0,
    # 600, 1200: the notice at 1050 waits until 1200, and the replacement is ready at
    # 1320, 1 unit short for 120 s after the reclaim at 1200.
    first_boot = 2 * 120.0
    assert run(None, "grid") * 3600 == pytest.approx(first_boot + 120.0)
    assert run(3600.0, "events") * 3600 == pytest.approx(first_boot)


def test_spothedge_learns_of_a_zone_without_room(tmp_path: Path) -> None:
    """Regression: the controller never filled `PoolView.last_refusal_at`, so SpotHedge
    kept a target in a zone without room for ever (at fleet scale it held most of its
    demand on on-demand). A pool the plan wants more in and that has no room now
    refuses as a launch there would, and SpotHedge moves on."""
    folder = tmp_path / "t"
    for name, values in (("a", [2] * 4), ("b", [2] * 4), ("c", [0] * 4)):
        write_json_trace(folder, name, values, gap_s=600)
    write_yaml(
        folder / "region.yaml", {"flavor": "gpu", "halls": 1, "guaranteed_quota_per_hall": 4}
    )
    spec = SimulationSpec(
        traces=folder, demand=_demand(tmp_path / "d.yaml", 2, 0), policy="spothedge"
    )
    url = sqlite_url(tmp_path / "state.db")
    result = Simulation.build(spec).run(url)
    store = SqlFleetStore(url)
    try:
        plan = store.latest_plan("p")
    finally:
        store.close()
    assert plan is not None
    assert not [p for p in plan.spot if p.endswith("/c")], plan.spot
    assert sum(plan.spot.values()) == 3  # the target and SpotHedge's one extra, in a and b
    assert any("preempted" in n and n.endswith("/c") for n in plan.notes), plan.notes
    assert result.partitions["p"].served_fraction > 0.9


def test_a_history_that_cannot_be_opened_fails_the_run_naming_it(tmp_path: Path) -> None:
    # chDB or ClickHouse opens beside the run; what opening it raised is the run's error.
    dsn = f"clickhouse://127.0.0.1:{free_port()}"
    spec = SimulationSpec(
        traces=_region(tmp_path / "t", [2, 2]),
        demand=_demand(tmp_path / "d.yaml", 2, 0),
        history_dsn=dsn,
    )
    with pytest.raises(HistoryUnavailable, match=re.escape(dsn)):
        Simulation.build(spec).run()
    assert not [t for t in threading.enumerate() if t.name.startswith("history-open")]
