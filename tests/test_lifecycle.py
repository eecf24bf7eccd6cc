"""The transition table, exhaustively."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from sco.domain.instances import expired, step
from sco.domain.lifecycle import (
    EDGES,
    HAS_SERVER,
    LIVE,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    State,
    Timeouts,
    Trigger,
    can,
    next_state,
)
from sco_harness.builders import instance, spot_pool


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(State)


def test_only_gone_is_terminal() -> None:
    assert {State.GONE} == TERMINAL


@pytest.mark.parametrize(("state", "trigger"), list(itertools.product(State, Trigger)))
def test_every_pair_is_an_edge_or_refused(state: State, trigger: Trigger) -> None:
    if (state, trigger) in EDGES:
        assert next_state(state, trigger) is EDGES[(state, trigger)]
        assert can(state, trigger)
    else:
        assert not can(state, trigger)
        with pytest.raises(IllegalTransition):
            next_state(state, trigger)


def _reachable(start: State) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reachable_from_requested() -> None:
    assert _reachable(State.REQUESTED) == set(State)


@pytest.mark.parametrize("state", list(State))
def test_gone_is_reachable_from_every_state(state: State) -> None:
    assert State.GONE in _reachable(state)


@pytest.mark.parametrize("state", sorted(set(State) - TERMINAL))
def test_every_non_terminal_state_has_a_timeout_along_an_edge(state: State) -> None:
    timeout = Timeouts().for_state(state)
    assert timeout is not None
    assert timeout.after_s > 0
    assert can(state, timeout.trigger)


def test_terminal_state_has_no_timeout() -> None:
    assert Timeouts().for_state(State.GONE) is None


def test_design_edges_exist() -> None:
    # DESIGN §6, edge by edge.
    assert next_state(State.REQUESTED, Trigger.CREATE_ACCEPTED) is State.CREATING
    assert next_state(State.REQUESTED, Trigger.CREATE_FAILED) is State.FAILED
    assert next_state(State.REQUESTED, Trigger.EXPIRED) is State.FAILED
    assert next_state(State.CREATING, Trigger.SERVER_ACTIVE) is State.ACTIVE
    assert next_state(State.CREATING, Trigger.SERVER_ERROR) is State.FAILED
    assert next_state(State.ACTIVE, Trigger.NODE_JOINED) is State.READY
    for s in (State.READY, State.ACTIVE):
        assert next_state(s, Trigger.RECLAIM_NOTICE) is State.NOTICED
        assert next_state(s, Trigger.DRAIN_REQUESTED) is State.DRAINING
    assert next_state(State.NOTICED, Trigger.DRAIN_REQUESTED) is State.DRAINING
    assert next_state(State.DRAINING, Trigger.DELETE_SENT) is State.TERMINATING
    assert next_state(State.TERMINATING, Trigger.SERVER_GONE) is State.GONE
    for s in (State.CREATING, State.ACTIVE, State.READY, State.NOTICED, State.DRAINING):
        assert next_state(s, Trigger.SERVER_VANISHED) is State.GONE


def test_live_and_server_sets() -> None:
    assert {State.REQUESTED, State.CREATING, State.ACTIVE, State.READY} == LIVE
    assert State.REQUESTED not in HAS_SERVER
    assert State.GONE not in HAS_SERVER


def test_step_bumps_version_and_records_the_edge() -> None:
    inst = instance(spot_pool(), State.ACTIVE, created_at=5.0)
    ch = step(inst, Trigger.NODE_JOINED, 42.0, "joined")
    assert ch.before is inst
    assert ch.after.state is State.READY
    assert ch.after.version == inst.version + 1
    assert ch.after.state_since == 42.0
    assert ch.after.ready_at == 42.0
    assert ch.trigger is Trigger.NODE_JOINED


def test_step_sets_the_fields_asked_and_keeps_the_rest() -> None:
    inst = instance(spot_pool(), State.READY, created_at=5.0)
    ch = step(inst, Trigger.RECLAIM_NOTICE, 50.0, "notice", notice_deadline=170.0)
    assert ch.after == dataclasses.replace(
        inst, state=State.NOTICED, state_since=50.0, version=inst.version + 1,
        reason="notice", notice_deadline=170.0,
    )  # fmt: skip
    with pytest.raises(TypeError, match="no field"):
        step(inst, Trigger.RECLAIM_NOTICE, 50.0, "notice", deadline=170.0)


def test_step_off_the_table_is_refused() -> None:
    inst = instance(spot_pool(), State.GONE)
    with pytest.raises(IllegalTransition):
        step(inst, Trigger.NODE_JOINED, 1.0, "nope")


def test_timeouts_fire_at_their_limit() -> None:
    t = Timeouts(requested_timeout_s=100)
    inst = instance(spot_pool(), State.REQUESTED, created_at=0.0)
    assert expired(inst, 99.0, t) is None
    assert expired(inst, 100.0, t) is Trigger.EXPIRED


def test_draining_times_out_after_its_deadline_not_before() -> None:
    t = Timeouts(draining_timeout_s=10)
    inst = instance(spot_pool(), State.DRAINING, state_since=0.0, drain_by=100.0)
    assert expired(inst, 50.0, t) is None
    assert expired(inst, 110.0, t) is Trigger.EXPIRED
