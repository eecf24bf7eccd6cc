"""Planner, arbiter and acquirer: unit cases and the invariants as properties."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sco.decide.acquirer import ActConfig, diff
from sco.decide.arbiter import ArbiterConfig, arbitrate
from sco.decide.hedge import HedgeConfig, HedgePlan, plan
from sco.decide.policies import (
    POLICIES,
    AllGuaranteedPolicy,
    ScoPolicy,
    UnknownPolicy,
    policy_named,
)
from sco.domain.instances import Instance
from sco.domain.lifecycle import State, Trigger
from sco.domain.snapshot import PoolView
from sco_harness.builders import (
    demand,
    guaranteed_pool,
    instance,
    pool_score,
    snapshot,
    spot_pool,
)

A = spot_pool("hall-1", "a", price=1.0)
B = spot_pool("hall-2", "b", price=1.0)
C = spot_pool("hall-3", "c", price=1.0)
G1 = guaranteed_pool("hall-1")
G2 = guaranteed_pool("hall-2")

# ---------------------------------------------------------------- the sco planner (hedge)

NO_SPARE = HedgeConfig(max_spare=0)


def _plan(views: list[PoolView], insts: list[Instance] | None = None, **want: int) -> HedgePlan:
    return plan(
        snapshot([*views, PoolView(G1, headroom=9)], insts or [], want=demand(**want)), NO_SPARE
    )


def test_hedge_spreads_over_equal_pools() -> None:
    p = _plan([PoolView(v, headroom=10) for v in (A, B, C)], target=6)
    assert p.spot == {A.id: 2, B.id: 2, C.id: 2}


def test_hedge_respects_headroom_and_guaranteed_covers_the_rest() -> None:
    p = _plan([PoolView(A, headroom=1), PoolView(B, headroom=1)], target=3, floor=3)
    assert p.spot == {A.id: 1, B.id: 1}
    assert p.guaranteed == {G1.id: 1}
    assert any("cannot arrive in time" in n for n in p.notes)


def test_hedge_keeps_what_excluded_pools_hold_but_adds_nothing_there() -> None:
    excluded = PoolView(A, headroom=10, excluded=True)
    p = _plan([excluded, PoolView(B, headroom=10)], [instance(A)], target=3)
    assert p.spot == {A.id: 1, B.id: 2}


def test_hedge_prefers_cheap_and_calm_pools() -> None:
    cheap = spot_pool("hall-1", "cheap", price=0.5)
    dear = spot_pool("hall-2", "dear", price=2.0)
    assert _plan([PoolView(cheap, headroom=5), PoolView(dear, headroom=5)], target=1).spot == {
        cheap.id: 1
    }
    stormy = PoolView(cheap, headroom=5, recent_reclaims=5)
    assert _plan([stormy, PoolView(dear, headroom=5)], target=1).spot == {dear.id: 1}


def test_hedge_ranks_by_what_history_says() -> None:
    shaky = PoolView(A, headroom=5, score=pool_score(A.id, 3.0))
    steady = PoolView(B, headroom=5, score=pool_score(B.id, 0.05))
    assert _plan([shaky, steady], target=1).spot == {B.id: 1}


def test_hedge_keeps_held_instances_where_they_are() -> None:
    # C is cheaper, but moving there would be churn; a fresh plan starts there.
    a = PoolView(spot_pool("hall-1", "a", price=1.05), headroom=5)
    b = PoolView(spot_pool("hall-2", "b", price=1.05), headroom=5)
    c = PoolView(spot_pool("hall-3", "c", price=1.0), headroom=5)
    held = [instance(a.pool), instance(b.pool)]
    assert _plan([a, b, c], held, target=2).spot == {a.pool.id: 1, b.pool.id: 1}
    assert c.pool.id in _plan([a, b, c], target=2).spot


def test_noticed_instances_do_not_count_as_held() -> None:
    noticed = instance(A, State.NOTICED)
    assert _plan([PoolView(A, headroom=1)], [noticed], target=1).spot == {A.id: 1}


# ---------------------------------------------------------------- arbiter


def test_arbiter_covers_the_floor_gap_counting_only_ready_spot() -> None:
    spot = [instance(A), instance(A, State.CREATING), instance(A, State.NOTICED)]
    snap = snapshot(
        [PoolView(A, 5), PoolView(G1, 5), PoolView(G2, 5)], spot, want=demand(target=4, floor=3)
    )
    g = arbitrate(snap, ArbiterConfig())
    assert sum(g.targets.values()) == 2  # one ready spot; floor 3
    assert set(g.targets) == {G1.id, G2.id}  # spread over halls


def test_arbiter_respects_budget_and_quota() -> None:
    snap = snapshot([PoolView(G1, 1)], want=demand(target=5, floor=5, budget=3))
    g = arbitrate(snap, ArbiterConfig())
    assert g.targets == {G1.id: 1}
    assert any("floor needs" in n for n in g.notes)
    assert any("floor at risk" in n for n in g.notes)


def test_arbiter_releases_only_after_spot_is_stable_and_one_at_a_time() -> None:
    now = 10_000.0
    fresh = [instance(A, ready_at=now - 60) for _ in range(3)]
    held = [instance(G1) for _ in range(3)]
    cfg = ArbiterConfig(release_after_s=600, max_release_per_cycle=1)
    snap = snapshot(
        [PoolView(A, 0), PoolView(G1, 0)], fresh + held, want=demand(target=3, floor=3), now=now
    )
    assert arbitrate(snap, cfg).targets == {G1.id: 3}
    stable = [instance(A, ready_at=now - 601) for _ in range(3)]
    snap = snapshot(
        [PoolView(A, 0), PoolView(G1, 0)], stable + held, want=demand(target=3, floor=3), now=now
    )
    assert arbitrate(snap, cfg).targets == {G1.id: 2}


def test_arbiter_releases_where_a_node_is_idle_before_where_work_runs() -> None:
    """Regression: two equal guaranteed pools, one node busy and one idle; the release
    went by pool id and drained the busy one (its pod evicted, the idle node kept)."""
    import dataclasses

    now = 10_000.0
    stable = [instance(A, ready_at=now - 601) for _ in range(2)]
    busy, idle = instance(G2), instance(G1)
    snap = snapshot([PoolView(A, 0), PoolView(G1, 0), PoolView(G2, 0)], [*stable, busy, idle],
                    want=demand(target=2, floor=1), now=now)  # fmt: skip
    cfg = ArbiterConfig(release_after_s=600, max_release_per_cycle=1)
    assert arbitrate(snap, cfg).targets == {G1.id: 1}  # by pool id, knowing nothing
    snap = dataclasses.replace(snap, busy=frozenset({busy.id}))
    assert arbitrate(snap, cfg).targets == {G2.id: 1}


def test_arbiter_counts_units_not_instances() -> None:
    # Guaranteed instances of 4 units: a floor of 10 with 3 ready spot units needs
    # 7 units, two whole instances, spread over two halls.
    g4a = guaranteed_pool("hall-1", units=4)
    g4b = guaranteed_pool("hall-2", units=4)
    spot = [instance(A) for _ in range(3)]
    snap = snapshot([PoolView(A, 0), PoolView(g4a, 5), PoolView(g4b, 5)], spot, want=demand(10, 10))
    g = arbitrate(snap, ArbiterConfig())
    assert g.targets == {g4a.id: 1, g4b.id: 1}
    assert g.need_units == 7
    assert g.short_units == 0


def test_arbiter_budget_caps_units() -> None:
    # A budget of 5 units with 4-unit instances buys one instance, not two: the budget
    # is a cap, and the floor is reported at risk by what it lacks.
    g4 = guaranteed_pool("hall-1", units=4)
    snap = snapshot([PoolView(g4, 9)], want=demand(target=8, floor=8, budget=5))
    g = arbitrate(snap, ArbiterConfig())
    assert g.targets == {g4.id: 1}
    assert g.need_units == 5
    assert g.short_units == 4
    assert any("budget 5" in n for n in g.notes)


def test_arbiter_takes_room_where_it_is_and_reports_what_it_lacks() -> None:
    # Hall 1 has room for one, hall 2 for two: the gap of 4 finds 3.
    snap = snapshot([PoolView(G1, 1), PoolView(G2, 2)], want=demand(target=4, floor=4))
    g = arbitrate(snap, ArbiterConfig())
    assert g.targets == {G1.id: 1, G2.id: 2}
    assert g.short_units == 1
    assert any("found no room" in n for n in g.notes)
    # Reservations of other partitions are not room.
    snap = snapshot([PoolView(G1, 3, reserved=3)], want=demand(target=1, floor=1))
    assert arbitrate(snap, ArbiterConfig()).targets == {}


def test_arbiter_counts_arriving_spot_and_extra_units() -> None:
    snap = snapshot([PoolView(A, 5), PoolView(G1, 5)], want=demand(3, 3))
    assert arbitrate(snap, ArbiterConfig(), arriving_units=3).targets == {}
    assert arbitrate(snap, ArbiterConfig(), arriving_units=3, extra_units=1).targets == {G1.id: 1}


def test_every_policy_keeps_the_floor_the_same_way() -> None:
    # Nothing ready, no spot room: each policy's guaranteed covers what it promises,
    # within the budget, spread over halls, through the one floor keeper.
    views = [PoolView(A, 0), PoolView(G1, 9), PoolView(G2, 9)]
    snap = snapshot(views, want=demand(target=4, floor=4, budget=3))
    # What `sco run` accepts is what each policy says of itself (keeps_floor): the
    # ones that say so keep it here, the baselines that do not put nothing under it.
    keepers = sorted(n for n in POLICIES if policy_named(n).keeps_floor)
    assert keepers == ["all-guaranteed", "cheapest", "sco", "spothedge"]
    for name in POLICIES:
        d = policy_named(name).decide(snap)
        if name not in keepers:
            assert d.guaranteed == {}, (name, d)
            continue
        assert sum(d.guaranteed.values()) == 3, (name, d)
        assert set(d.guaranteed) == {G1.id, G2.id}, (name, d)


def test_hedge_puts_no_spare_on_guaranteed_when_the_floor_has_a_margin() -> None:
    # Two spot pools, three replicas: spot cannot spread a spare. With floor 3 the
    # floor itself is at stake and a spare goes on guaranteed; with floor 2 a
    # reclaim costs target, not floor, and no guaranteed server is bought.
    now = 10_000.0
    ready = [instance(A, ready_at=now - 60), instance(A, ready_at=now - 60), instance(B)]
    views = [
        PoolView(A, 5, up_since=now - 60, recent_reclaims=1),
        PoolView(B, 5, up_since=now - 60),
        PoolView(G1, 9),
    ]
    tight = plan(snapshot(views, ready, want=demand(3, 3, max_units=6), now=now), HedgeConfig())
    assert sum(tight.guaranteed.values()) >= 1
    loose = plan(snapshot(views, ready, want=demand(3, 2, max_units=6), now=now), HedgeConfig())
    assert loose.guaranteed == {}
    assert sum(loose.spot.values()) >= 3


def test_hedge_explains_every_pool() -> None:
    now = 10_000.0
    views = [
        PoolView(A, 5, up_since=now - 7200, recent_reclaims=1),
        PoolView(B, 5, excluded=True),
        PoolView(G1, 9),
    ]
    p = plan(snapshot(views, want=demand(2, 1), now=now), HedgeConfig())
    assert set(p.pools) == {A.id, B.id, G1.id}
    a = p.pools[A.id]
    assert a.target == p.spot[A.id]
    assert a.terms["recent_reclaims"] == 1.0
    assert a.terms["age"] == pytest.approx(1.0 / 3.0)
    assert a.terms["storm"] == 1.0
    assert "excluded" in p.pools[B.id].flags
    assert p.terms["cold_start_s"] == 120.0
    assert p.terms["floor_need_units"] == 0.0


def test_hedge_takes_cold_start_and_notice_from_the_pools() -> None:
    now = 10_000.0
    ready = [instance(p, ready_at=now - 60) for p in (A, B, C)]
    slow = [PoolView(p, 5, up_since=now - 60, cold_start_s=900.0) for p in (A, B, C)]
    p = plan(snapshot([*slow, PoolView(G1, 9)], ready, want=demand(3, 3), now=now), NO_SPARE)
    assert p.terms["cold_start_s"] == 900.0
    warned = [
        PoolView(p, 5, up_since=now - 60, cold_start_s=100.0, notice_s=120.0) for p in (A, B, C)
    ]
    p = plan(snapshot([*warned, PoolView(G1, 9)], ready, want=demand(3, 3), now=now), HedgeConfig())
    assert p.terms["notice_s"] == 120.0
    assert p.terms["spare"] == 0.0  # the notice covers a cold start: no spare


def test_policies_by_name() -> None:
    assert isinstance(policy_named("sco"), ScoPolicy)
    assert isinstance(policy_named("all-guaranteed"), AllGuaranteedPolicy)
    with pytest.raises(UnknownPolicy, match="all-guaranteed"):
        policy_named("nope")


def test_all_guaranteed_covers_the_target_without_spot() -> None:
    snap = snapshot([PoolView(A, 9), PoolView(G1, 9)], want=demand(target=4, floor=1))
    d = AllGuaranteedPolicy().decide(snap)
    assert d.spot == {}
    assert sum(d.guaranteed.values()) == 4


# ---------------------------------------------------------------- acquirer


def test_acquirer_creates_within_available_and_batch() -> None:
    snap = snapshot([PoolView(A, headroom=8, reserved=3)])
    acts = diff(snap, {A.id: 10}, ActConfig(max_batch=4))
    assert [(c.pool, c.count) for c in acts.creates] == [(A.id, 4)]
    acts = diff(snap, {A.id: 10}, ActConfig(max_batch=50))
    assert [(c.pool, c.count) for c in acts.creates] == [(A.id, 5)]


def test_acquirer_replaces_from_the_notice_and_drains_by_the_deadline() -> None:
    noticed = instance(A, State.NOTICED, notice_deadline=10_120.0, created_at=9_000.0)
    snap = snapshot([PoolView(A, headroom=2)], [noticed, instance(A)])
    acts = diff(snap, {A.id: 2}, ActConfig())
    assert [(c.pool, c.count) for c in acts.creates] == [(A.id, 1)]
    assert [(d.instance_id, d.drain_by) for d in acts.drains] == [(noticed.id, 10_120.0)]


def test_acquirer_deletes_only_after_drain() -> None:
    d1 = instance(A, State.DRAINING, drain_by=20_000.0)
    d2 = instance(A, State.DRAINING, drain_by=20_000.0)
    snap = snapshot([PoolView(A, 0)], [d1, d2])
    acts = diff(snap, {}, ActConfig(), drained=frozenset({d1.id}))
    assert [d.instance_id for d in acts.deletes] == [d1.id]
    late = snapshot([PoolView(A, 0)], [d1, d2], now=20_000.0)
    assert {d.instance_id for d in diff(late, {}, ActConfig()).deletes} == {d1.id, d2.id}


def test_acquirer_removes_cheapest_to_lose_first() -> None:
    ready_old = instance(A, created_at=9_001.0)
    ready_new = instance(A, created_at=9_002.0)
    booting = instance(A, State.CREATING, created_at=9_003.0)
    snap = snapshot([PoolView(A, 0)], [ready_old, ready_new, booting], want=demand(target=1))
    acts = diff(snap, {A.id: 1}, ActConfig())
    assert [d.instance_id for d in acts.deletes] == [booting.id]
    assert [d.instance_id for d in acts.drains] == [ready_new.id]


def test_pinned_nodes_are_kept_from_sco_s_own_moves_but_not_from_a_reclaim() -> None:
    # Two ready where the plan wants one: the pinned one is never the one taken away.
    pinned, free = instance(A, created_at=9_002.0), instance(A, created_at=9_001.0)
    snap = snapshot([PoolView(A, 0)], [pinned, free], want=demand(target=1))
    acts = diff(snap, {A.id: 1}, ActConfig(), pinned=frozenset({pinned.id}))
    assert [d.instance_id for d in acts.drains] == [free.id]
    # Both pinned: nothing goes, and nothing is created in their place either.
    both = frozenset({pinned.id, free.id})
    acts = diff(snap, {A.id: 1}, ActConfig(), pinned=both)
    assert acts.empty
    # A drain sco began waits past its deadline; one a reclaim began does not.
    own = instance(A, State.DRAINING, drain_by=20_000.0)
    reclaimed = instance(A, State.DRAINING, drain_by=20_000.0, notice_deadline=20_000.0)
    late = snapshot([PoolView(A, 0)], [own, reclaimed], now=20_000.0)
    acts = diff(late, {}, ActConfig(), pinned=frozenset({own.id, reclaimed.id}))
    assert [d.instance_id for d in acts.deletes] == [reclaimed.id]
    # Nor does the draining timeout end it (issue 27's replay: a busy Slurm node sco
    # drained expired after 30 minutes and its job's work was lost); unpinned, it does.
    much_later = snapshot([PoolView(A, 0)], [own], now=20_000.0 + 86_400.0)
    acts = diff(much_later, {}, ActConfig(), pinned=frozenset({own.id}))
    assert acts.empty
    acts = diff(much_later, {}, ActConfig())
    assert [e.instance_id for e in acts.expirations] == [own.id]


def test_spot_moves_make_before_break() -> None:
    # The plan moves one instance from A to B: B's is created, A's stays until B's is ready.
    a1, a2 = instance(A, created_at=9_000.0), instance(A, created_at=9_001.0)
    snap = snapshot([PoolView(A, 5), PoolView(B, 5)], [a1, a2], want=demand(target=2))
    acts = diff(snap, {A.id: 1, B.id: 1}, ActConfig())
    assert [(c.pool, c.count) for c in acts.creates] == [(B.id, 1)]
    assert acts.drains == ()
    b1 = instance(B, created_at=9_500.0)
    snap = snapshot([PoolView(A, 5), PoolView(B, 5)], [a1, a2, b1], want=demand(target=2))
    acts = diff(snap, {A.id: 1, B.id: 1}, ActConfig())
    assert [d.instance_id for d in acts.drains] == [a2.id]


def test_acquirer_never_drains_below_the_floor() -> None:
    ready = [instance(A) for _ in range(3)]
    snap = snapshot([PoolView(A, 0)], ready, want=demand(target=0, floor=2))
    acts = diff(snap, {}, ActConfig())
    assert len(acts.drains) == 1


def test_failed_records_are_cleaned_up() -> None:
    no_server = instance(A, State.FAILED, server=False)
    with_server = instance(A, State.FAILED)
    acts = diff(snapshot([PoolView(A, 0)], [no_server, with_server], now=1.0), {}, ActConfig())
    assert [c.instance_id for c in acts.closes] == [no_server.id]
    assert [(d.instance_id, d.trigger) for d in acts.deletes] == [
        (with_server.id, Trigger.DELETE_SENT)
    ]


def test_timeouts_become_actions() -> None:
    stuck = instance(A, State.REQUESTED, created_at=0.0)
    acts = diff(snapshot([PoolView(A, 5)], [stuck], now=10_000.0), {A.id: 1}, ActConfig())
    assert [e.instance_id for e in acts.expirations] == [stuck.id]
    # The stuck record no longer counts as live: a replacement is created.
    assert [(c.pool, c.count) for c in acts.creates] == [(A.id, 1)]


# ---------------------------------------------------------------- properties

POOLS = [spot_pool("hall-1", "a"), spot_pool("hall-2", "b"), guaranteed_pool("hall-3")]
LIVE_STATES = [
    State.REQUESTED,
    State.CREATING,
    State.ACTIVE,
    State.READY,
    State.NOTICED,
    State.DRAINING,
    State.FAILED,
    State.TERMINATING,
]


@st.composite
def situations(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    views = [
        PoolView(p, headroom=draw(st.integers(0, 12)), reserved=draw(st.integers(0, 12)))
        for p in POOLS
    ]
    insts = [
        instance(
            POOLS[draw(st.integers(0, len(POOLS) - 1))],
            draw(st.sampled_from(LIVE_STATES)),
            created_at=draw(st.floats(0, 9_000)),
            drain_by=draw(st.one_of(st.none(), st.floats(0, 20_000))),
        )
        for _ in range(draw(st.integers(0, 15)))
    ]
    floor = draw(st.integers(0, 10))
    target = draw(st.integers(floor, 14))
    targets = {p.id: draw(st.integers(0, 12)) for p in POOLS}
    return views, insts, demand(target=target, floor=floor, max_units=20), targets


@settings(max_examples=300, deadline=None)
@given(situations(), st.integers(1, 20))
def test_acquirer_never_asks_beyond_available(sit, batch) -> None:  # type: ignore[no-untyped-def]
    views, insts, want, targets = sit
    snap = snapshot(views, insts, want=want)
    acts = diff(snap, targets, ActConfig(max_batch=batch))
    asked = Counter[str]()
    for c in acts.creates:
        assert c.count > 0
        asked[c.pool] += c.count
    cfg = ActConfig(max_batch=batch)
    for pool, n in asked.items():
        assert n <= snap.pools[pool].available
        assert n <= cfg.batch(snap.pools[pool].available)
        assert n <= batch or n <= math.ceil(cfg.batch_fraction * snap.pools[pool].available)


def test_batches_follow_the_room_at_scale() -> None:
    cfg = ActConfig()
    assert cfg.batch(40) == 10, "small pools: batches of max_batch"
    assert cfg.batch(1000) == 250, "a fleet's pool: a quarter of its room per call"
    assert ActConfig(batch_fraction=0.0).batch(1000) == 10


@settings(max_examples=300, deadline=None)
@given(situations())
def test_acquirer_never_takes_ready_capacity_below_the_floor(sit) -> None:  # type: ignore[no-untyped-def]
    views, insts, want, targets = sit
    snap = snapshot(views, insts, want=want)
    acts = diff(snap, targets, ActConfig())
    ready = {i.id: i for i in insts if i.state is State.READY}
    timed_out = {e.instance_id for e in acts.expirations}
    removed_by_choice = [d.instance_id for d in acts.drains if d.instance_id in ready]
    removed_by_choice += [d.instance_id for d in acts.deletes if d.instance_id in ready]
    before = sum(i.units for i in ready.values() if i.id not in timed_out)
    after = before - sum(ready[i].units for i in removed_by_choice)
    assert after >= min(before, want.floor_units)


@settings(max_examples=300, deadline=None)
@given(situations())
def test_every_action_follows_an_edge_of_the_table(sit) -> None:  # type: ignore[no-untyped-def]
    from sco.domain.lifecycle import can

    views, insts, want, targets = sit
    acts = diff(snapshot(views, insts, want=want), targets, ActConfig())
    by_id = {i.id: i for i in insts}
    for d in acts.drains:
        assert can(by_id[d.instance_id].state, Trigger.DRAIN_REQUESTED)
    for d in acts.deletes:
        assert can(by_id[d.instance_id].state, d.trigger)
    for e in acts.expirations:
        assert can(by_id[e.instance_id].state, Trigger.EXPIRED)
    for c in acts.closes:
        assert can(by_id[c.instance_id].state, Trigger.SERVER_GONE)
    touched = [d.instance_id for d in acts.drains] + [d.instance_id for d in acts.deletes]
    touched += [e.instance_id for e in acts.expirations] + [c.instance_id for c in acts.closes]
    assert len(touched) == len(set(touched)), "one action per instance per cycle"


@settings(max_examples=300, deadline=None)
@given(situations(), st.integers(0, 12), st.integers(0, 6))
def test_the_floor_keeper_stays_within_budget_and_room(sit, budget, arriving) -> None:  # type: ignore[no-untyped-def]
    views, insts, want, _ = sit
    want = demand(want.target_units, want.floor_units, want.max_units, budget)
    snap = snapshot(views, insts, want=want)
    g = arbitrate(snap, ArbiterConfig(release_after_s=0), arriving_units=arriving)
    held = Counter(i.pool for i in insts if i.is_live and not i.is_spot)
    held_units = sum(held.values())  # 1 unit each here
    added = {p: n - held.get(p, 0) for p, n in g.targets.items() if n > held.get(p, 0)}
    for p, n in added.items():
        assert n <= snap.pools[p].available, "growth only within room"
    if added:
        assert sum(g.targets.values()) <= max(held_units, budget), "growth never past budget"
    ready = sum(i.units for i in insts if i.is_spot and i.state is State.READY)
    if sum(g.targets.values()) < held_units:  # releasing: the floor still holds
        assert sum(g.targets.values()) + ready + arriving >= min(want.floor_units, budget)


# ---------------------------------------------------------------- at fleet scale


def _fleet(n: int, pool: object, state: State = State.READY) -> list[Instance]:
    return [instance(pool, state) for _ in range(n)]  # type: ignore[arg-type]


def test_a_large_floor_survives_losing_its_largest_pools() -> None:
    """Floor 100 over spot of 60/50/40 ready in three pools: losing the largest leaves
    90, so guaranteed covers 10; losing the two largest (`pool_loss_pools=2`) leaves
    40, so it covers 60. A small floor relies on spares."""
    views = [PoolView(A, headroom=0), PoolView(B, headroom=0), PoolView(C, headroom=0)]
    insts = _fleet(60, A) + _fleet(50, B) + _fleet(40, C)

    def planned(floor: int, cfg: HedgeConfig) -> HedgePlan:
        want = demand(150, floor, 200)
        return plan(snapshot([*views, PoolView(G1, headroom=500)], insts, want=want), cfg)

    one = planned(100, NO_SPARE)
    assert one.spot == {A.id: 60, B.id: 50, C.id: 40}
    assert one.terms["pool_loss_units"] == 60
    assert sum(one.guaranteed.values()) == 10
    two = planned(100, HedgeConfig(max_spare=0, pool_loss_pools=2))
    assert two.terms["pool_loss_units"] == 110
    assert sum(two.guaranteed.values()) == 60
    small = planned(40, NO_SPARE)
    assert small.terms["pool_loss_units"] == 0
    assert sum(small.guaranteed.values()) == 0


def test_a_fleet_spreads_by_hazard_not_evenly() -> None:
    """Regression: a fixed cost per replica sharing a pool spread 1,000 replicas evenly
    over every pool whatever its hazard, so each pool that came back (fresh: the most
    likely to go again) got its even share. Crowding per even share lets the calm
    pools hold more; with a few replicas it is the paper setting's cost."""
    calm = [PoolView(v, headroom=1000, up_since=0.0) for v in (A, B)]
    fresh = PoolView(C, headroom=1000, up_since=9_990.0)
    p = plan(
        snapshot([*calm, fresh, PoolView(G1, headroom=9)], want=demand(900, 0, 1000)), NO_SPARE
    )
    assert p.spot[C.id] < p.spot[A.id] - 15  # evenly it would be 300 each
    assert p.terms["crowding_per_h"] == pytest.approx(10.0 / 300)
    few = plan(snapshot([*calm, fresh, PoolView(G1, headroom=9)], want=demand(3, 0)), NO_SPARE)
    assert few.spot == {A.id: 1, B.id: 1, C.id: 1}
    assert few.terms["crowding_per_h"] == 10.0


def test_guaranteed_covers_the_target_that_spot_cannot_place() -> None:
    """No spot room for 30 of a target of 100 above a floor of 10: guaranteed takes
    the 30 (cover_target); what spot is booting toward counts as arriving."""
    views = [PoolView(A, headroom=40), PoolView(B, headroom=30)]
    p = plan(
        snapshot([*views, PoolView(G1, headroom=500)], [], want=demand(100, 10, 200)), NO_SPARE
    )
    assert sum(p.spot.values()) == 70
    assert sum(p.guaranteed.values()) == 30
    only_floor = HedgeConfig(max_spare=0, cover_target=False)
    q = plan(
        snapshot([*views, PoolView(G1, headroom=500)], [], want=demand(100, 10, 200)), only_floor
    )
    assert sum(q.guaranteed.values()) == 0  # booting spot covers the floor of 10


def test_spares_and_releases_grow_with_the_fleet() -> None:
    cfg = HedgeConfig()
    assert cfg.spare_cap(3) == cfg.max_spare  # the 3-replica setting keeps its cap
    assert cfg.spare_cap(1000) == 50
    assert HedgeConfig(max_spare=0).spare_cap(1000) == 0  # 0 still turns spares off
    arb = ArbiterConfig(max_release_per_cycle=3, release_fraction=0.1)
    assert arb.release_limit(5) == 3
    assert arb.release_limit(600) == 60
    assert ArbiterConfig(max_release_per_cycle=None).release_limit(600) is None


def test_a_fleet_releases_guaranteed_in_proportion() -> None:
    """600 guaranteed held against 1,000 ready spot and a floor of 100: a tenth goes back
    in one cycle, not three."""
    views = [PoolView(v, headroom=0) for v in (A, B, C)]
    insts = _fleet(340, A) + _fleet(330, B) + _fleet(330, C) + _fleet(600, G1)
    snap = snapshot([*views, PoolView(G1, headroom=0)], insts, want=demand(1000, 100, 1200))
    g = arbitrate(snap, HedgeConfig().arbiter)
    assert g.released == 60


def test_reclaims_count_up_to_a_cap_in_the_hazard() -> None:
    """A zone that lost 500 instances at once is one bad event, not 500."""
    cfg = HedgeConfig()
    many = PoolView(A, headroom=5, recent_reclaims=500)
    few = PoolView(A, headroom=5, recent_reclaims=cfg.reclaim_count_cap)
    from sco.decide.hedge import hazard_per_h

    assert hazard_per_h(many, 0.0, cfg) == hazard_per_h(few, 0.0, cfg)
