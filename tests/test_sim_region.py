"""The simulated region: pools from traces, headroom, server timing, reclaims, drains, faults.
What it answers as any provider does (tags, listings by partition and installation,
deletes, shortfalls, typed errors) is tests/conformance/test_provider.py's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sco.domain.pools import CapacityClass, PoolId
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import InsufficientCapacity, NodeView, RetryableProviderError, ServerStatus
from sco_harness.builders import write_json_trace, write_yaml

P = "p1"


class Recorder:
    """A SimObserver that writes down every call."""

    def __init__(self) -> None:
        self.held_calls: list[tuple[float, PoolId, str, int]] = []
        self.running_calls: list[tuple[float, str, PoolId, int, float]] = []
        self.price_calls: list[tuple[float, PoolId, float]] = []
        self.capacity_calls: list[tuple[float, PoolId, int]] = []
        self.reclaimed_calls: list[tuple[float, str, PoolId, int, float]] = []
        self.created_calls: list[tuple[float, str, PoolId, int]] = []

    def held(self, t: float, pool: PoolId, partition: str, delta: int) -> None:
        self.held_calls.append((t, pool, partition, delta))

    def running(
        self, t: float, partition: str, pool: PoolId, delta_units: int, created_at: float
    ) -> None:
        self.running_calls.append((t, partition, pool, delta_units, created_at))

    def price(self, t: float, pool: PoolId, price_per_h: float) -> None:
        self.price_calls.append((t, pool, price_per_h))

    def capacity(self, t: float, pool: PoolId, instances: int) -> None:
        self.capacity_calls.append((t, pool, instances))

    def reclaimed(
        self, t: float, partition: str, pool: PoolId, units: int, notice_s: float
    ) -> None:
        self.reclaimed_calls.append((t, partition, pool, units, notice_s))

    def created(self, t: float, partition: str, pool: PoolId, count: int) -> None:
        self.created_calls.append((t, partition, pool, count))


def make_region(
    folder: Path,
    series: Mapping[str, Sequence[int]],
    config: SimConfig | None = None,
    *,
    gap_s: int = 100,
    spec: Mapping[str, object] | None = None,
    observer: Recorder | None = None,
    start_s: float | None = None,
) -> SimRegion:
    for name, values in series.items():
        write_json_trace(folder, name, values, gap_s=gap_s)
    if spec is not None:
        write_yaml(folder / "region.yaml", spec)
    traces = load_traces(folder)
    return SimRegion(traces, config or SimConfig(), start_s=start_s, observer=observer)


def spot_id(region: SimRegion, series: str) -> PoolId:
    (pool,) = [p for p in region.pools() if p.aggregate == series]
    return pool.id


def one_pool(
    tmp_path: Path,
    values: Sequence[int],
    config: SimConfig | None = None,
    *,
    spec: Mapping[str, object] | None = None,
    observer: Recorder | None = None,
    start_s: float | None = None,
) -> tuple[SimRegion, PoolId]:
    region = make_region(
        tmp_path, {"s": values}, config, spec=spec, observer=observer, start_s=start_s
    )
    return region, spot_id(region, "s")


# ---------------------------------------------------------------- pools


def test_one_spot_pool_per_series_and_one_guaranteed_per_hall(tmp_path: Path) -> None:
    region = make_region(
        tmp_path / "west",
        {"a": [3] * 4, "b": [3] * 4, "c": [3] * 4},
        spec={"halls": 2, "flavor": "v100", "units_per_instance": 2},
    )
    pools = region.pools()
    spot = {p.aggregate: p for p in pools if p.capacity_class is CapacityClass.SPOT}
    guaranteed = [p for p in pools if p.capacity_class is CapacityClass.GUARANTEED]
    assert set(spot) == {"a", "b", "c"}
    # Round robin over the halls in series order.
    assert [spot[s].hall for s in ("a", "b", "c")] == ["hall-1", "hall-2", "hall-1"]
    assert sorted(p.hall for p in guaranteed) == ["hall-1", "hall-2"]
    assert all(p.aggregate == "guaranteed" for p in guaranteed)
    assert {p.region for p in pools} == {"west"}  # the folder's name by default
    assert {p.flavor for p in pools} == {"v100"}
    assert {p.units_per_instance for p in pools} == {2}
    assert spot["a"].id == "west/hall-1/v100/a"
    assert len(pools) == 5


def test_region_spec_names_halls_prices_and_quota(tmp_path: Path) -> None:
    region = make_region(
        tmp_path,
        {"a": [3] * 4, "b": [3] * 4},
        spec={
            "name": "r9",
            "halls": 1,
            "hall_of": {"b": "hall-7"},
            "spot_price_per_h": 0.5,
            "guaranteed_quota_per_hall": 4,
        },
    )
    pools = {p.id: p for p in region.pools()}
    assert pools["r9/hall-1/standard/a"].price_per_h == 0.5
    assert pools["r9/hall-7/standard/b"].price_per_h == 0.5
    g1, g7 = "r9/hall-1/standard/guaranteed", "r9/hall-7/standard/guaranteed"
    assert pools[g1].price_per_h == pytest.approx(1.5)  # 3x the spot price by default
    assert region.headroom([g1, g7]) == {g1: 4, g7: 4}
    assert region.prices([g1, "r9/hall-1/standard/a"]) == {
        g1: pytest.approx(1.5),
        "r9/hall-1/standard/a": 0.5,
    }


def test_guaranteed_pool_is_held_to_its_quota(tmp_path: Path) -> None:
    region = make_region(
        tmp_path, {"a": [0] * 4}, spec={"halls": 1, "guaranteed_quota_per_hall": 2}
    )
    (g,) = [p.id for p in region.pools() if p.capacity_class is CapacityClass.GUARANTEED]
    res = region.create(g, 3, "r1", P, 1)
    assert len(res.server_ids) == 2
    assert res.shortfall_reason
    with pytest.raises(InsufficientCapacity):
        region.create(g, 1, "r2", P, 1)


# ---------------------------------------------------------------- headroom and create


def test_headroom_is_capacity_minus_held(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [5, 5, 5, 5])
    assert region.capacity_of(pool) == 5
    assert region.headroom([pool]) == {pool: 5}
    res = region.create(pool, 3, "r1", P, 1)
    assert len(res.server_ids) == 3
    assert res.shortfall_reason == ""
    assert region.held_in(pool) == 3
    assert region.headroom([pool]) == {pool: 2}


def test_pool_size_scales_count_traces_too(tmp_path: Path) -> None:
    # A count trace at fleet scale: each unit stands for pool_size instances, given one;
    # without one, a count is a count (the region spec's size is for 0/1 traces).
    region, pool = one_pool(tmp_path / "a", [5, 3, 5], SimConfig(pool_size=100))
    assert region.capacity_of(pool) == 500
    region.advance_to(100.0)
    assert region.capacity_of(pool) == 300
    plain, pool = one_pool(tmp_path / "b", [5, 3, 5], spec={"pool_size": 100})
    assert plain.capacity_of(pool) == 5


def test_a_create_beyond_headroom_reports_what_it_made(tmp_path: Path) -> None:
    obs = Recorder()
    region, pool = one_pool(tmp_path, [5, 5, 5, 5], observer=obs)
    region.create(pool, 3, "r1", P, 1)
    res = region.create(pool, 4, "r2", P, 1)
    assert len(res.server_ids) == 2
    assert obs.created_calls == [(0.0, P, pool, 3), (0.0, P, pool, 2)]
    assert [d for *_, d in obs.held_calls] == [1] * 5


def test_create_in_an_empty_pool_raises(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [0, 3])
    with pytest.raises(InsufficientCapacity):
        region.create(pool, 1, "r1", P, 1)
    region.advance_to(100)
    assert len(region.create(pool, 1, "r1", P, 1).server_ids) == 1


# ---------------------------------------------------------------- server timing


def test_servers_list_after_latency_turn_active_and_join(tmp_path: Path) -> None:
    cfg = SimConfig(api_latency_s=2.0, cold_start_s=10.0, join_s=5.0)
    region, pool = one_pool(tmp_path, [4] * 4, cfg)
    (sid,) = region.create(pool, 1, "req-1", P, 7).server_ids

    region.advance_to(1.9)
    assert not region.list(P)
    region.advance_to(2.0)
    (view,) = listed = region.list(P)
    # The same listing until a server changes (sco's adapters know it by identity),
    # and one that cannot be changed under the region.
    assert region.list(P) is listed
    assert isinstance(listed, tuple)
    assert view.server_id == sid
    assert view.status is ServerStatus.BUILD
    assert view.created_at == 0.0
    assert view.notice_deadline is None

    region.advance_to(9.9)
    assert region.list(P)[0].status is ServerStatus.BUILD
    region.advance_to(10.0)
    assert region.list(P)[0].status is ServerStatus.ACTIVE
    assert not region.nodes(P)[sid].joined

    region.advance_to(14.9)
    assert not region.nodes(P)[sid].joined
    region.advance_to(15.0)
    node = region.nodes(P)[sid]
    assert node.joined
    assert not node.drained


def test_running_is_reported_when_the_node_joins(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(cold_start_s=10.0, join_s=5.0)
    region, pool = one_pool(tmp_path, [4] * 4, cfg, spec={"units_per_instance": 3}, observer=obs)
    region.advance_to(20.0)
    region.create(pool, 1, "r1", P, 1)
    region.advance_to(34.0)
    assert obs.running_calls == []
    region.advance_to(40.0)
    assert obs.running_calls == [(35.0, P, pool, 3, 20.0)]


def test_next_event_time_walks_the_schedule(tmp_path: Path) -> None:
    cfg = SimConfig(api_latency_s=1.0, cold_start_s=10.0, join_s=0.0)
    region, pool = one_pool(tmp_path, [4, 4, 4, 4], cfg)  # no value changes after t=0
    assert region.next_event_time() is None
    region.create(pool, 1, "r1", P, 1)
    assert region.next_event_time() == 1.0
    region.advance_to(1.0)
    assert region.next_event_time() == 10.0


# ---------------------------------------------------------------- reclaims


def test_capacity_drop_reclaims_the_newest_without_notice(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(cold_start_s=10.0)
    region, pool = one_pool(tmp_path, [4, 4, 2, 2], cfg, observer=obs)
    old = region.create(pool, 2, "r1", P, 1).server_ids
    region.advance_to(50.0)
    new = region.create(pool, 2, "r2", P, 1).server_ids
    region.advance_to(199.0)
    assert {v.server_id for v in region.list(P)} == {*old, *new}
    assert all(v.notice_deadline is None for v in region.list(P))

    region.advance_to(200.0)
    assert {v.server_id for v in region.list(P)} == set(old)
    assert set(region.nodes(P)) == set(old)
    assert region.held_in(pool) == 2
    assert region.capacity_of(pool) == 2
    assert region.headroom([pool]) == {pool: 0}
    assert obs.reclaimed_calls == [(200.0, P, pool, 1, 0.0)] * 2
    assert obs.held_calls[-2:] == [(200.0, pool, P, -1)] * 2
    # Both reclaimed servers were running (joined at 60): their units stop at the reclaim.
    assert [c for c in obs.running_calls if c[3] < 0] == [(200.0, P, pool, -1, 50.0)] * 2


def test_drop_that_still_fits_reclaims_nothing(tmp_path: Path) -> None:
    obs = Recorder()
    region, pool = one_pool(tmp_path, [5, 3, 3], observer=obs)
    region.create(pool, 3, "r1", P, 1)
    region.advance_to(150.0)
    assert region.held_in(pool) == 3
    assert obs.reclaimed_calls == []
    assert (100.0, pool, 3) in obs.capacity_calls


def test_notice_marks_the_newest_and_they_vanish_at_the_drop(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(notice_s=50.0, cold_start_s=10.0)
    region, pool = one_pool(tmp_path, [4, 4, 2, 2], cfg, observer=obs)
    old = region.create(pool, 2, "r1", P, 1).server_ids
    region.advance_to(20.0)
    new = region.create(pool, 2, "r2", P, 1).server_ids

    region.advance_to(149.0)
    assert all(v.notice_deadline is None for v in region.list(P))
    assert obs.reclaimed_calls == []

    region.advance_to(150.0)
    deadlines = {v.server_id: v.notice_deadline for v in region.list(P)}
    assert deadlines == {old[0]: None, old[1]: None, new[0]: 200.0, new[1]: 200.0}
    assert obs.reclaimed_calls == [(150.0, P, pool, 1, 50.0)] * 2
    assert region.headroom([pool]) == {pool: 0}

    region.advance_to(199.0)
    assert len(region.list(P)) == 4
    region.advance_to(200.0)
    assert {v.server_id for v in region.list(P)} == set(old)
    assert region.held_in(pool) == 2
    # Announced once, not again when they go.
    assert len(obs.reclaimed_calls) == 2


def test_headroom_already_excludes_an_announced_drop(tmp_path: Path) -> None:
    cfg = SimConfig(notice_s=50.0)
    region, pool = one_pool(tmp_path, [4, 4, 2, 2], cfg)
    region.create(pool, 1, "r1", P, 1)
    region.advance_to(149.0)
    assert region.headroom([pool]) == {pool: 3}
    region.advance_to(150.0)
    assert region.capacity_of(pool) == 4  # the drop itself is still ahead
    assert region.headroom([pool]) == {pool: 1}
    assert all(v.notice_deadline is None for v in region.list(P))  # one server fits after it
    region.advance_to(200.0)
    assert region.headroom([pool]) == {pool: 1}


def test_notice_longer_than_the_lead_in_is_given_at_the_start(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(notice_s=500.0)
    region, pool = one_pool(tmp_path, [3, 3, 0, 0], cfg, observer=obs)
    # The drop at 200 is announced at once: nothing may be created now.
    assert region.headroom([pool]) == {pool: 0}
    with pytest.raises(InsufficientCapacity):
        region.create(pool, 1, "r1", P, 1)


def test_start_mid_trace_uses_the_value_in_force(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [1, 6, 2, 2], start_s=150.0)
    assert region.now == 150.0
    assert region.capacity_of(pool) == 6
    region.advance_to(200.0)
    assert region.capacity_of(pool) == 2


# ---------------------------------------------------------------- drain and delete


def test_drain_keeps_a_joined_node_running_until_drain_by_minus_drain_s(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(cold_start_s=10.0, join_s=0.0, drain_s=30.0)
    region, pool = one_pool(tmp_path, [4] * 4, cfg, observer=obs)
    (sid,) = region.create(pool, 1, "r1", P, 1).server_ids
    region.advance_to(20.0)
    assert region.nodes(P)[sid].joined
    assert obs.running_calls == [(10.0, P, pool, 1, 0.0)]

    region.drain(P, sid, drain_by=100.0)
    region.advance_to(69.9)
    assert len(obs.running_calls) == 1
    assert not region.nodes(P)[sid].drained
    region.advance_to(70.0)
    assert obs.running_calls[-1] == (70.0, P, pool, -1, 0.0)
    region.advance_to(99.9)
    assert not region.nodes(P)[sid].drained
    region.advance_to(100.0)
    assert region.nodes(P)[sid].drained
    # Draining does not delete: the server is still there, holding capacity.
    assert region.held_in(pool) == 1
    assert [v.server_id for v in region.list(P)] == [sid]


def test_drain_of_a_node_not_yet_joined_is_drained_at_once(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(cold_start_s=10.0, join_s=0.0)
    region, pool = one_pool(tmp_path, [4] * 4, cfg, observer=obs)
    (sid,) = region.create(pool, 1, "r1", P, 1).server_ids
    region.drain(P, sid, drain_by=100.0)
    assert region.nodes(P)[sid].drained
    region.advance_to(50.0)
    assert not region.nodes(P)[sid].joined
    assert obs.running_calls == []


def test_drain_of_another_partitions_node_is_ignored(tmp_path: Path) -> None:
    cfg = SimConfig(cold_start_s=10.0, drain_s=30.0)
    region, pool = one_pool(tmp_path, [4] * 4, cfg)
    (sid,) = region.create(pool, 1, "r1", P, 1).server_ids
    region.advance_to(10.0)
    region.drain("other", sid, drain_by=40.0)
    region.advance_to(100.0)
    assert region.nodes(P)[sid] == NodeView(
        joined=True, drained=False, joined_at=10.0, leaving=False
    )


def test_delete_removes_the_server_after_delete_s(tmp_path: Path) -> None:
    obs = Recorder()
    cfg = SimConfig(cold_start_s=10.0, delete_s=5.0)
    region, pool = one_pool(tmp_path, [2] * 4, cfg, observer=obs)
    a, b = region.create(pool, 2, "r1", P, 1).server_ids
    region.advance_to(20.0)
    region.delete([a])
    assert obs.running_calls[-1] == (20.0, P, pool, -1, 0.0)  # stops serving at once

    region.advance_to(24.9)
    assert {v.server_id for v in region.list(P)} == {a, b}
    assert region.headroom([pool]) == {pool: 0}  # still holds its capacity
    region.advance_to(25.0)
    assert [v.server_id for v in region.list(P)] == [b]
    assert a not in region.nodes(P)
    assert region.headroom([pool]) == {pool: 1}
    assert obs.held_calls[-1] == (25.0, pool, P, -1)
    assert region.server_count() == 1


def test_delete_before_active_never_activates(tmp_path: Path) -> None:
    cfg = SimConfig(api_latency_s=1.0, cold_start_s=10.0, delete_s=50.0)
    region, pool = one_pool(tmp_path, [2] * 4, cfg)
    (sid,) = region.create(pool, 1, "r1", P, 1).server_ids
    region.advance_to(2.0)
    region.delete([sid])
    region.advance_to(30.0)
    (view,) = region.list(P)
    assert view.status is ServerStatus.BUILD
    assert not region.nodes(P)[sid].joined


# ---------------------------------------------------------------- 0/1 traces


def test_binary_trace_one_stands_for_pool_size(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [1, 1, 0, 1], SimConfig(pool_size=3))
    assert region.capacity_of(pool) == 3
    region.advance_to(200.0)
    assert region.capacity_of(pool) == 0
    region.advance_to(300.0)
    assert region.capacity_of(pool) == 3


def test_binary_trace_pool_size_defaults_to_the_region_spec(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path / "x", [1, 0])
    assert region.capacity_of(pool) == 8
    region2, pool2 = one_pool(tmp_path / "y", [1, 0], spec={"pool_size": 5})
    assert region2.capacity_of(pool2) == 5


def test_counts_trace_is_taken_literally_without_a_pool_size(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [2, 1, 0])
    assert region.capacity_of(pool) == 2
    region.advance_to(100.0)
    assert region.capacity_of(pool) == 1


def test_unlimited_binary(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [1, 1, 0], SimConfig(unlimited_binary=True, pool_size=3))
    assert region.capacity_of(pool) >= 1_000_000
    assert len(region.create(pool, 500, "r1", P, 1).server_ids) == 500
    region.advance_to(200.0)
    assert region.capacity_of(pool) == 0
    assert region.held_in(pool) == 0


# ---------------------------------------------------------------- faults


def _failure_pattern(region: SimRegion, pool: PoolId, calls: int) -> list[str]:
    out = []
    for i in range(calls):
        try:
            if i % 2:
                region.list(P)
            else:
                region.create(pool, 1, f"r{i}", P, 1)
            out.append("ok")
        except RetryableProviderError:
            out.append("5xx")
    return out


def test_seeded_faults_are_deterministic(tmp_path: Path) -> None:
    cfg = SimConfig(error_rate=0.4, seed=42)
    one, pool1 = one_pool(tmp_path / "one", [1000] * 3, cfg)
    two, pool2 = one_pool(tmp_path / "two", [1000] * 3, cfg)
    first = _failure_pattern(one, pool1, 60)
    second = _failure_pattern(two, pool2, 60)
    assert first == second
    assert "5xx" in first
    assert "ok" in first
    # A failed create created nothing.
    assert one.server_count() == sum(1 for i, r in enumerate(first) if i % 2 == 0 and r == "ok")


def test_faults_are_off_by_default(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [1000] * 3)
    assert _failure_pattern(region, pool, 200) == ["ok"] * 200
    region.delete(["srv-0000001"])


def test_every_call_fails_at_error_rate_one(tmp_path: Path) -> None:
    region, pool = one_pool(tmp_path, [10] * 3, SimConfig(error_rate=1.0))
    with pytest.raises(RetryableProviderError):
        region.create(pool, 1, "r1", P, 1)
    with pytest.raises(RetryableProviderError):
        region.list(P)
    with pytest.raises(RetryableProviderError):
        region.delete([])
    assert region.server_count() == 0


# ---------------------------------------------------------------- clock and config


def test_advance_to_refuses_to_go_back(tmp_path: Path) -> None:
    region, _ = one_pool(tmp_path, [1, 1, 1])
    region.advance_to(50.0)
    region.advance_to(50.0)  # standing still is fine
    with pytest.raises(ValueError, match="forward"):
        region.advance_to(49.0)
    assert region.now == 50.0


@pytest.mark.parametrize(
    "kwargs",
    [{"cold_start_s": -1.0}, {"notice_s": -0.1}, {"error_rate": 1.5}, {"timeout_rate": -0.1}],
)
def test_config_refuses_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SimConfig(**kwargs)  # type: ignore[arg-type]
