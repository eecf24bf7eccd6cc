"""Whole jobs in one pool: the pure placement of gangs (`sco.decide.gangs`), the
planner that uses it, the Slurm intake that reports gangs and their checkpoints, and
the lab's topology/tree model that keeps a job's nodes together."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec, need
from sco.adapters.slurm.model import CheckpointError, checkpoint_s, parse_jobs, parse_nodes
from sco.decide.acquirer import ActConfig, diff
from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.gangs import lasts, place_gangs, waste
from sco.decide.hedge import HedgeConfig, plan
from sco.decide.policies import ScoPolicy
from sco.domain.demand import Demand, DemandError, Gang, Partition, SchedulerKind, within
from sco.domain.lifecycle import State
from sco.domain.pools import PoolId
from sco.domain.snapshot import PoolView
from sco.engine.clock import ManualClock
from sco.lab.traces import load_traces
from sco.lab.workload.cluster import BatchCluster
from sco.lab.workload.replay import ReplaySpec, widest_pool
from sco.lab.workload.swf import BatchJob
from sco.lab.workload.topology import pick
from sco_harness.builders import guaranteed_pool, instance, snapshot, spot_pool
from test_slurm_unit import PART, job, node

A, B, C = PoolId("a"), PoolId("b"), PoolId("c")


def _safe_in(*safe: PoolId) -> Any:
    return lambda p, s: 0.99 if p in safe else 0.5


def test_a_gang_goes_whole_to_the_pool_where_it_likeliest_lasts() -> None:
    counts, choices = place_gangs(
        [Gang(4, 3600.0, name="7")], {A: 8, B: 8}, _safe_in(B), {}, 1.0, 3600.0
    )
    assert counts == {B: 4}
    assert choices[0].pools == {B: 4}
    assert choices[0].candidates == 2
    assert "job 7 (4 units" in choices[0].describe()
    assert "survival 0.990" in choices[0].describe()


def test_price_weighs_against_survival() -> None:
    # B lasts better but costs 3x more: A's expected waste (0.5) is the cheaper risk.
    counts, _ = place_gangs([Gang(2)], {A: 4, B: 4}, _safe_in(B), {B: 2.0}, 1.0, 3600.0)
    assert counts == {A: 2}


def test_widest_first_and_a_gang_no_pool_holds_takes_the_fewest_pools() -> None:
    # The 5-wide gang takes the only pool that holds it; the 3-wide one what is left.
    counts, choices = place_gangs(
        [Gang(3, name="small"), Gang(5, name="wide")], {A: 5, B: 3, C: 2},
        _safe_in(C), {}, 1.0, 3600.0,
    )  # fmt: skip
    assert [c.gang.name for c in choices] == ["wide", "small"]
    assert choices[0].pools == {A: 5}
    assert choices[1].pools == {B: 3}
    counts, choices = place_gangs([Gang(6)], {A: 4, B: 2, C: 3}, _safe_in(A, C), {}, 1.0, 60.0)
    assert sum(counts.values()) == 6
    assert len(choices[0].pools) == 2
    assert "no pool had room for 6" in choices[0].describe()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 12), max_size=8),
    st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 15), min_size=1),
    st.dictionaries(st.sampled_from([A, B, C]), st.floats(0.0, 1.0)),
)
def test_gangs_never_overbook_a_pool_and_stay_whole_when_one_holds_them(
    widths: list[int], room: dict[PoolId, int], survival: dict[PoolId, float]
) -> None:
    gangs = [Gang(w) for w in widths]
    counts, choices = place_gangs(gangs, room, lambda p, s: survival.get(p, 0.5), {}, 1.0, 3600.0)
    assert all(counts[p] <= room[p] for p in counts)
    assert sum(counts.values()) <= sum(widths)
    left = dict(room)
    for c in choices:  # each in turn: whole in one pool whenever one had room for it
        if any(r >= c.gang.units for r in left.values()):
            assert len(c.pools) == 1
        for p, n in c.pools.items():
            left[p] -= n


def test_survival_falls_with_time_and_rises_with_age() -> None:
    fresh, old = {"age": 1.0}, {"age": 1.0 / 11}
    assert lasts(fresh, 0.0, 1.0, 1.0, 3600) == pytest.approx(0.5)  # (1 / (1 + 1))^1
    assert lasts(old, 10.0, 1.0, 1.0, 3600) == pytest.approx(11 / 12)
    assert lasts(fresh, 0.0, 1.0, 1.0, 7200) < lasts(fresh, 0.0, 1.0, 1.0, 3600)
    with_rate = {"age": 1.0, "recent_reclaims": 1.0}
    assert lasts(with_rate, 0.0, 1.0, 1.0, 3600) == pytest.approx(0.5 * math.exp(-1))
    assert waste(1.0) == 0.0
    assert waste(0.5) == pytest.approx(0.5)
    assert waste(0.0) < math.inf


def test_a_gangs_stake_is_its_run_or_its_checkpoint_interval() -> None:
    assert Gang(2, 7200.0).at_stake_s(60.0) == 7200.0
    assert Gang(2, 7200.0, 600.0).at_stake_s(60.0) == 600.0
    assert Gang(2).at_stake_s(60.0) == 60.0
    with pytest.raises(DemandError, match="gangs"):
        Gang(0)
    with pytest.raises(DemandError, match="checkpoint_s"):
        Gang(2, checkpoint_s=0.0)


def test_the_planner_puts_a_new_job_in_one_pool_not_spread() -> None:
    """Without gangs the planner spreads six units over three pools (a pool's
    reclaim takes all it holds); a pending job of six nodes gets them in one."""
    pools = [spot_pool("hall-1", "a"), spot_pool("hall-2", "b"), spot_pool("hall-3", "c")]
    views = [PoolView(p, headroom=8, up_since=0.0, notice_s=300.0) for p in pools]
    views.append(PoolView(guaranteed_pool("hall-1"), headroom=20))
    spread = plan(snapshot(views, want=Demand(6, 0, 20, 20)), HedgeConfig(max_spare=0))
    assert len([n for n in spread.spot.values() if n]) == 3
    gang = Demand(6, 0, 20, 20, gangs=(Gang(6, 3600.0, name="42"),))
    whole = plan(snapshot(views, want=gang), HedgeConfig(max_spare=0))
    assert sorted(whole.spot.values()) == [6]
    assert whole.terms["gangs_placed"] == 1.0
    assert any(n.startswith("gang: job 42 (6 units, 1.00 h at stake)") for n in whole.notes)


def test_the_planner_prefers_the_pool_that_has_lasted_for_a_long_job() -> None:
    old, fresh = spot_pool("hall-1", "old"), spot_pool("hall-2", "fresh")
    views = [
        PoolView(fresh, headroom=8, up_since=9_000.0),
        PoolView(old, headroom=8, up_since=0.0),
        PoolView(guaranteed_pool("hall-1"), headroom=20),
    ]
    want = Demand(4, 0, 20, 20, gangs=(Gang(4, 4 * 3600.0),))
    p = plan(snapshot(views, want=want), HedgeConfig(max_spare=0, boot_spare=False))
    assert p.spot == {old.id: 4}


def test_the_intake_reports_jobs_the_idle_nodes_cannot_take_as_gangs() -> None:
    wide = job(1, nodes=3, cpus=6, mem="3000M")
    declared = {**job(2, nodes=2, cpus=4, mem="2000M"), "comment": "sco:checkpoint=10m"}
    small = job(3)
    idle = [node("sco-x", last_busy=0), node("sco-y", last_busy=0)]
    n = need(PART, parse_jobs({"jobs": [wide, declared, small]}, "t"),
             parse_nodes({"nodes": idle}, "t"), 1000.0)  # fmt: skip
    # Job 1 cannot have the two idle nodes; job 2 takes them; job 3 is one node.
    assert [(g.name, g.units, g.run_s, g.checkpoint_s) for g in n.gangs] == [("1", 3, 300.0, None)]
    bad = {**job(4, nodes=2, cpus=4, mem="2000M"), "comment": "sco:checkpoint=often"}
    m = need(PART, parse_jobs({"jobs": [bad]}, "t"), [], 1000.0)
    assert [g.name for g in m.gangs] == ["4"]
    assert m.gangs[0].checkpoint_s is None
    assert m.bad_checkpoints[0][0] == 4
    assert "sco:checkpoint=often" in m.bad_checkpoints[0][1]


def test_checkpoint_declarations_are_read_or_refused_by_name() -> None:
    assert checkpoint_s("") is None
    assert checkpoint_s("nightly sco:checkpoint=30m") == 1800.0
    assert checkpoint_s("sco:checkpoint=90") == 90.0
    assert checkpoint_s("sco:checkpoint=1.5h") == 5400.0
    for bad in ("sco:checkpoint=", "sco:checkpoint=0", "sco:checkpoint=5d", "sco:checkpoint=-1"):
        with pytest.raises(CheckpointError, match="sco:checkpoint="):
            checkpoint_s(bad)
    with pytest.raises(CheckpointError, match="more than once"):
        checkpoint_s("sco:checkpoint=1m sco:checkpoint=2m")


def test_squeue_time_limits_read_as_seconds_and_unlimited_as_none() -> None:
    limited = parse_jobs({"jobs": [job(1)]}, "t")[0]
    assert limited.limit_s == 300.0
    unlimited = parse_jobs({"jobs": [{**job(1), "time_limit": 0xFFFFFFFF}]}, "t")[0]
    assert unlimited.limit_s is None
    newer = parse_jobs({"jobs": [{**job(1), "time_limit": {"set": True, "number": 2}}]}, "t")[0]
    assert newer.limit_s == 120.0


@dataclass
class _N:
    name: str
    where: tuple[str, str]


def test_topology_tree_takes_the_tightest_pool_then_one_hall() -> None:
    free = [_N("a1", ("h1", "a")), _N("b1", ("h1", "b")), _N("a2", ("h1", "a")),
            _N("c1", ("h2", "c")), _N("c2", ("h2", "c")), _N("c3", ("h2", "c")),
            _N("b2", ("h1", "b"))]  # fmt: skip
    assert [n.name for n in pick(free, 2)] == ["a1", "a2"]  # a and b fit; a came first
    assert [n.name for n in pick(free, 3)] == ["c1", "c2", "c3"]
    assert sorted(n.name for n in pick(free, 4)) == ["a1", "a2", "b1", "b2"]  # hall h1
    assert len({n.where for n in pick(free, 6)}) == 3  # the whole cluster, fullest first


# ---------------------------------------------------------------- one pool per job


def test_with_one_pool_a_job_no_pools_idle_nodes_hold_asks_for_new_nodes() -> None:
    a = "sco,sco-hpc,spot,pool-h1-a"
    b = "sco,sco-hpc,spot,pool-h2-b"
    idle = [node("sco-a1", features=a), node("sco-a2", features=a),
            node("sco-b1", features=b), node("sco-b2", features=b)]  # fmt: skip
    three = job(1, nodes=3, cpus=6, mem="3000M")
    nodes = parse_nodes({"nodes": idle}, "t")
    jobs = parse_jobs({"jobs": [three]}, "t")
    spread = need(PART, jobs, nodes, 1000.0)
    assert spread.target == 3
    assert spread.gangs == ()
    whole = need(PART, jobs, nodes, 1000.0, one_pool=True)
    assert [(g.name, g.units, g.whole) for g in whole.gangs] == [("1", 3, True)]
    assert whole.target == 3  # three new nodes; the idle ones are not wanted for it
    two = parse_jobs({"jobs": [job(2, nodes=2, cpus=4, mem="2000M")]}, "t")
    fits = need(PART, two, nodes, 1000.0, one_pool=True)
    assert (fits.target, fits.gangs) == (2, ())  # pool a's (or b's) two idle nodes


def test_a_whole_gang_no_spot_pool_holds_goes_to_one_guaranteed_pool() -> None:
    small = [spot_pool("hall-1", "a"), spot_pool("hall-2", "b")]
    g1, g2 = guaranteed_pool("hall-1"), guaranteed_pool("hall-2")
    views = [PoolView(p, headroom=3, up_since=0.0) for p in small]
    views += [PoolView(g1, headroom=10), PoolView(g2, headroom=10)]
    want = Demand(5, 0, 20, 20, gangs=(Gang(5, 3600.0, name="9", whole=True),))
    p = plan(snapshot(views, want=want), HedgeConfig(max_spare=0, boot_spare=False))
    assert sum(p.spot.values()) == 0
    assert sorted(p.guaranteed.values()) == [5]  # one pool, not one per hall
    assert any("job 9 (5 units" in n and "guaranteed" in n for n in p.notes)
    assert p.terms["gangs_guaranteed_units"] == 5.0


def test_the_lab_runs_a_job_of_many_nodes_in_the_first_pool_that_holds_it() -> None:
    clock = ManualClock(0.0)
    c = BatchCluster("lab", PART.shape, clock.now, PART.feature)
    c.pool_order = ["pool-b", "pool-a"]
    for name, pool in [("a1", "pool-a"), ("a2", "pool-a"), ("b1", "pool-b"), ("a3", "pool-a")]:
        c.register(name, frozenset({"sco", PART.feature, pool}))
    c.submit(BatchJob(1, 0.0, 3, 100.0, 100.0))
    c.submit(BatchJob(2, 0.0, 1, 100.0, 100.0))
    c.step()
    assert c.jobs_by_id[1].nodes == ("a1", "a2", "a3")  # only pool a holds three
    assert c.jobs_by_id[2].nodes == ("b1",)  # the first pool in the order
    c.submit(BatchJob(3, 1.0, 2, 100.0, 100.0))
    c.register("b2", frozenset({"sco", PART.feature, "pool-b"}))
    c.register("c1", frozenset({"sco", PART.feature, "pool-c"}))
    clock.advance(1.0)
    c.step()
    assert c.jobs_by_id[3].state == "PENDING"  # b2 and c1 are free, in two pools
    assert c.jobs_by_id[1].pools_spanned == 1


def test_a_capped_target_keeps_only_the_gangs_under_its_cap() -> None:
    gangs = (Gang(4, name="a"), Gang(8, name="b"), Gang(2, name="c"))
    assert within(gangs, 20, 20) == gangs  # nothing capped
    # 6 nodes of other work first; 12 of room: a (4), then b (8) fits; c waits.
    assert [g.name for g in within(gangs, 20, 18)] == ["a", "b"]
    assert [g.name for g in within(gangs, 20, 13)] == ["a"]  # b waits: c waits behind it
    assert within(gangs, 20, 6) == ()


def test_a_gang_stays_where_its_nodes_are_booting() -> None:
    safe, fresh = spot_pool("hall-1", "safe"), spot_pool("hall-2", "fresh")
    views = [
        PoolView(safe, headroom=8, up_since=0.0),
        PoolView(fresh, headroom=4, up_since=9_000.0),
        PoolView(guaranteed_pool("hall-1"), headroom=20),
    ]
    booting = [instance(fresh, State.CREATING) for _ in range(4)]
    want = Demand(4, 0, 20, 20, gangs=(Gang(4, 4 * 3600.0, name="1"),))
    p = plan(snapshot(views, booting, want=want), HedgeConfig(max_spare=0, boot_spare=False))
    assert p.spot == {fresh.id: 4}  # moving it would cost a cold start


def test_guaranteed_for_whole_gangs_counts_no_spot_and_grows_in_one_pool() -> None:
    spot = spot_pool("hall-1", "a")
    g1, g2, g3 = (guaranteed_pool(h) for h in ("hall-1", "hall-2", "hall-3"))
    views = [PoolView(spot, headroom=0, up_since=0.0)]
    views += [PoolView(g, headroom=20) for g in (g1, g2, g3)]
    ready = [instance(spot, State.READY) for _ in range(6)]  # idle, and of no use to it
    want = Demand(6, 0, 20, 20)
    spread = arbitrate(snapshot(views, ready, want=want), ArbiterConfig(), cover_units=6)
    assert spread.targets == {}  # ready spot covers six units of other work
    held = [instance(g2, State.READY) for _ in range(2)]
    whole = arbitrate(
        snapshot(views, ready + held, want=want), ArbiterConfig(), cover_units=6, whole=[6]
    )
    assert whole.targets == {g2.id: 6}  # in the pool that holds most, not one per hall


def test_guaranteed_held_over_two_pools_grows_one_to_hold_a_whole_gang() -> None:
    """Found by the real-Slurm replay bench: 3 guaranteed nodes in one hall and 1 in
    another counted as 4 for a job of 4 nodes that must run in one pool, and it waited
    until the end of the run."""
    g1, g2 = guaranteed_pool("hall-1"), guaranteed_pool("hall-2")
    views = [PoolView(g1, headroom=10), PoolView(g2, headroom=10)]
    want = Demand(4, 0, 20, 20)
    held = [instance(g1, State.READY) for _ in range(3)] + [instance(g2, State.READY)]
    grown = arbitrate(snapshot(views, held, want=want), ArbiterConfig(), cover_units=4, whole=[4])
    assert grown.targets == {g1.id: 4, g2.id: 1}
    assert any(f"1 guaranteed more in {g1.id}" in n for n in grown.notes)
    held.append(instance(g1, State.READY))  # grown; hall-2's is idle and of no use
    cfg = ArbiterConfig(release_after_s=0)
    kept = arbitrate(snapshot(views, held, want=want), cfg, cover_units=4, whole=[4])
    assert kept.targets == {g1.id: 4}  # hall-2's goes, never one of the gang's four
    tight = Demand(4, 0, 20, 4)  # a budget of four: hall-2's makes room at once
    capped = arbitrate(snapshot(views, held[:4], want=tight), cfg, cover_units=4, whole=[4])
    assert capped.targets == {g1.id: 4}


def test_a_gang_no_guaranteed_pool_holds_spans_the_fewest_pools() -> None:
    """A job of 6 nodes where each pool has room for 4: it takes all four of the
    pool with most to give and two of the next, not three and three over halls."""
    g1, g2, g3 = (guaranteed_pool(f"hall-{n}") for n in (1, 2, 3))
    views = [PoolView(g1, headroom=4), PoolView(g2, headroom=4), PoolView(g3, headroom=4)]
    held = [instance(g2, State.READY)]
    want = Demand(6, 0, 20, 20)
    grown = arbitrate(snapshot(views, held, want=want), ArbiterConfig(), cover_units=6, whole=[6])
    assert grown.targets == {g2.id: 5, g1.id: 1}  # g2 has 1 held + 4 room to give
    assert sum(grown.targets.values()) == 6
    small = Demand(1, 0, 20, 20)
    spread = arbitrate(snapshot(views, want=small), ArbiterConfig(), cover_units=3)
    assert spread.targets == {g1.id: 1, g2.id: 1, g3.id: 1}  # no gang: over halls


def test_without_notice_a_long_gang_skips_a_pool_it_would_not_outlast() -> None:
    counts, choices = place_gangs(
        [Gang(4, name="long")], {A: 8}, lambda p, s: 0.2, {}, 1.0, 3600.0, guaranteed=1.0
    )
    assert counts == {}  # waste(0.2) = 2.0 > guaranteed's 1.0: guaranteed capacity
    assert "not worth the risk" in choices[0].describe()
    counts, _ = place_gangs([Gang(4)], {A: 8}, lambda p, s: 0.8, {}, 1.0, 3600.0, guaranteed=1.0)
    assert counts == {A: 4}  # waste(0.8) = 0.125: spot


def test_only_without_notice_does_a_gang_buy_guaranteed_for_its_stake() -> None:
    fresh = spot_pool("hall-1", "fresh")

    def decide(notice_s: float) -> Any:
        views = [
            PoolView(fresh, headroom=8, up_since=9_900.0, notice_s=notice_s),
            PoolView(guaranteed_pool("hall-1", price=3.0), headroom=20),
        ]
        want = Demand(4, 0, 20, 20, gangs=(Gang(4, 8 * 3600.0, name="7"),))
        return plan(snapshot(views, want=want), HedgeConfig(max_spare=0, boot_spare=False))

    blind = decide(0.0)
    assert (blind.spot, sum(blind.guaranteed.values())) == ({}, 4)
    warned = decide(300.0)  # the notice saves its work: a reclaim costs a requeue
    assert warned.spot == {fresh.id: 4}


def test_a_gangs_nodes_are_asked_for_in_one_create() -> None:
    """A create asks for a quarter of a pool's room (at least 10) at a time, and a job of
    32 nodes waited two more cycles for its last nodes. A gang's nodes now come in one
    create (Nova places all of it or none; a gang runs when all are up)."""
    pool = spot_pool("hall-1", "a")
    views = [PoolView(pool, headroom=50, up_since=0.0)]
    views.append(PoolView(guaranteed_pool("hall-1"), headroom=50))
    want = Demand(32, 0, 64, 64, gangs=(Gang(32, 3600.0, name="5"),))
    d = ScoPolicy(HedgeConfig(max_spare=0, boot_spare=False)).decide(snapshot(views, want=want))
    assert d.batches == {pool.id: 32}
    snap = snapshot(views, want=want)
    assert [c.count for c in diff(snap, d.spot, ActConfig()).creates] == [13]  # a quarter
    assert [c.count for c in diff(snap, d.spot, ActConfig(), batches=d.batches).creates] == [32]


def test_the_source_names_a_refused_checkpoint_declaration_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = {**job(7, nodes=2, cpus=4, mem="2000M"), "comment": "sco:checkpoint=soon"}

    class View:
        def read(self) -> Any:
            return parse_jobs({"jobs": [bad]}, "t"), []

    spec = SlurmDemandSpec(Partition("hpc", "r", SchedulerKind.SLURM), PART, 0, 8, 8)
    source = SlurmDemandSource(View(), [spec])  # type: ignore[arg-type]
    d = source.demand("hpc", 1000.0)
    assert [(g.name, g.checkpoint_s) for g in d.gangs] == [("7", None)]
    assert "job 7's checkpoint declaration is refused: 'sco:checkpoint=soon'" in caplog.text
    caplog.clear()
    source.demand("hpc", 1030.0)
    assert "checkpoint" not in caplog.text  # said once


def test_a_job_wider_than_any_pool_is_left_free_to_span_pools() -> None:
    a, b = "sco,sco-hpc,spot,pool-h1-a", "sco,sco-hpc,spot,pool-h2-b"
    idle = parse_nodes({"nodes": [node("sco-a1", features=a), node("sco-b1", features=b)]}, "t")
    wide = parse_jobs({"jobs": [job(1, nodes=3, cpus=6, mem="3000M")]}, "t")
    kept = need(PART, wide, idle, 1000.0, one_pool=True)
    assert [(g.units, g.whole) for g in kept.gangs] == [(3, True)]
    free = need(PART, wide, idle, 1000.0, one_pool=True, one_pool_max_nodes=2)
    assert [(g.units, g.whole) for g in free.gangs] == [(3, False)]  # may be split
    clock = ManualClock(0.0)
    c = BatchCluster("lab", PART.shape, clock.now, PART.feature)
    c.pool_order, c.pool_widest = ["pool-a", "pool-b"], 2
    for name, pool in [("a1", "pool-a"), ("a2", "pool-a"), ("b1", "pool-b")]:
        c.register(name, frozenset({"sco", PART.feature, pool}))
    c.submit(BatchJob(1, 0.0, 3, 100.0, 100.0))
    c.step()
    assert c.jobs_by_id[1].state == "RUNNING"  # across a and b: no pool holds three
    assert c.jobs_by_id[1].pools_spanned == 2


def test_the_replay_leaves_free_the_jobs_wider_than_its_widest_pool() -> None:
    bundled = Path(__file__).parent.parent / "src/sco/data/traces/apache/v100-9zone"
    traces = load_traces(bundled)
    spec = ReplaySpec(Path("w.swf"), bundled, pool_size=16)
    assert widest_pool(spec, traces) == 16  # a zone's 1 stands for 16 instances
    assert widest_pool(ReplaySpec(Path("w.swf"), bundled, pool_size=50), traces) == 50
