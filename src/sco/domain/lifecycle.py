"""The instance lifecycle as data: states, triggers, the edges between them, timeouts.

Every change of an instance's state is one edge of `EDGES`, named by what
triggers it. Code never sets a state directly; it asks `next_state` and gets
an `IllegalTransition` for anything the table does not allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cache


class State(StrEnum):
    REQUESTED = "requested"  # record written, create not yet accepted by the provider
    CREATING = "creating"  # provider accepted; server building
    ACTIVE = "active"  # server running; node not yet in its scheduler
    READY = "ready"  # node joined its scheduler: counts as capacity
    NOTICED = "noticed"  # provider announced a reclaim; replacement starts now
    DRAINING = "draining"  # node told to leave its scheduler by drain_by
    TERMINATING = "terminating"  # delete sent
    FAILED = "failed"  # create refused, server errored, or a timeout gave up on it
    GONE = "gone"  # server no longer exists: terminal


class Trigger(StrEnum):
    CREATE_ACCEPTED = "create_accepted"
    CREATE_FAILED = "create_failed"
    SERVER_ACTIVE = "server_active"
    SERVER_ERROR = "server_error"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"  # a ready node out of its scheduler (absent, down) too long
    RECLAIM_NOTICE = "reclaim_notice"
    DRAIN_REQUESTED = "drain_requested"  # sco removes it, or a noticed node starts leaving
    DELETE_SENT = "delete_sent"
    DELETE_RESENT = "delete_resent"  # delete did not take within its timeout
    SERVER_GONE = "server_gone"  # gone after our delete, or never created
    SERVER_VANISHED = "server_vanished"  # gone without our delete: reclaimed
    EXPIRED = "expired"  # the state's timeout elapsed


S, T = State, Trigger

EDGES: Mapping[tuple[State, Trigger], State] = {
    # A create is accepted, refused, or never answered.
    (S.REQUESTED, T.CREATE_ACCEPTED): S.CREATING,
    (S.REQUESTED, T.CREATE_FAILED): S.FAILED,
    (S.REQUESTED, T.EXPIRED): S.FAILED,
    # A server boots, errors, is refused by the scheduler after the create was taken
    # (no valid host), is reclaimed while building, or is cancelled.
    (S.CREATING, T.SERVER_ACTIVE): S.ACTIVE,
    (S.CREATING, T.CREATE_FAILED): S.FAILED,
    (S.CREATING, T.SERVER_ERROR): S.FAILED,
    (S.CREATING, T.EXPIRED): S.FAILED,
    (S.CREATING, T.RECLAIM_NOTICE): S.NOTICED,
    (S.CREATING, T.SERVER_VANISHED): S.GONE,
    (S.CREATING, T.DELETE_SENT): S.TERMINATING,
    # A running server's node joins its scheduler, or never does.
    (S.ACTIVE, T.NODE_JOINED): S.READY,
    (S.ACTIVE, T.EXPIRED): S.FAILED,
    (S.ACTIVE, T.SERVER_ERROR): S.FAILED,
    (S.ACTIVE, T.RECLAIM_NOTICE): S.NOTICED,
    (S.ACTIVE, T.DRAIN_REQUESTED): S.DRAINING,
    (S.ACTIVE, T.DELETE_SENT): S.TERMINATING,
    (S.ACTIVE, T.SERVER_VANISHED): S.GONE,
    # A ready node is reclaimed, removed by sco, fails, or its scheduler loses it.
    (S.READY, T.RECLAIM_NOTICE): S.NOTICED,
    (S.READY, T.DRAIN_REQUESTED): S.DRAINING,
    (S.READY, T.SERVER_ERROR): S.FAILED,
    (S.READY, T.NODE_LOST): S.FAILED,
    (S.READY, T.SERVER_VANISHED): S.GONE,
    # A noticed node drains before its deadline, or is gone first; a second notice with
    # a sooner deadline moves its deadline up.
    (S.NOTICED, T.DRAIN_REQUESTED): S.DRAINING,
    (S.NOTICED, T.DELETE_SENT): S.TERMINATING,
    (S.NOTICED, T.SERVER_VANISHED): S.GONE,
    (S.NOTICED, T.EXPIRED): S.FAILED,
    (S.NOTICED, T.RECLAIM_NOTICE): S.NOTICED,
    # A draining node is deleted once drained or at its deadline. A reclaim notice
    # reaching it (sco was removing it, or a sooner notice came) makes it a noticed
    # node again: it is drained anew with the reclaim's deadline, which may cut work
    # short where sco's own move would not.
    (S.DRAINING, T.RECLAIM_NOTICE): S.NOTICED,
    (S.DRAINING, T.DELETE_SENT): S.TERMINATING,
    (S.DRAINING, T.SERVER_VANISHED): S.GONE,
    (S.DRAINING, T.EXPIRED): S.FAILED,
    # A deleted server goes away; a slow delete is sent again.
    (S.TERMINATING, T.SERVER_GONE): S.GONE,
    (S.TERMINATING, T.SERVER_VANISHED): S.GONE,
    (S.TERMINATING, T.DELETE_RESENT): S.TERMINATING,
    # A failed instance is cleaned up.
    (S.FAILED, T.DELETE_SENT): S.TERMINATING,
    (S.FAILED, T.SERVER_GONE): S.GONE,
    (S.FAILED, T.SERVER_VANISHED): S.GONE,
}

TRANSITIONS: Mapping[State, frozenset[State]] = {
    state: frozenset(to for (frm, _), to in EDGES.items() if frm is state) for state in State
}

TERMINAL: frozenset[State] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)

# States whose instance is, or is about to be, capacity that stays: the
# acquirer counts these against a pool's target. NOTICED and later are leaving.
LIVE: frozenset[State] = frozenset({S.REQUESTED, S.CREATING, S.ACTIVE, S.READY})

# States in which a server may exist at the provider.
HAS_SERVER: frozenset[State] = frozenset(TRANSITIONS) - TERMINAL - {S.REQUESTED}


@dataclass(frozen=True, slots=True)
class Timeout:
    """How long a state may last, and the trigger fired when it has lasted too long."""

    after_s: float
    trigger: Trigger


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-state timeouts. Every non-terminal state has one."""

    requested_timeout_s: float = 300.0
    creating_timeout_s: float = 1800.0
    active_timeout_s: float = 900.0
    ready_timeout_s: float = float("inf")  # a ready node may run for ever
    noticed_timeout_s: float = 3600.0
    draining_timeout_s: float = 1800.0
    terminating_timeout_s: float = 300.0
    failed_timeout_s: float = 60.0

    def for_state(self, state: State) -> Timeout | None:
        """The timeout of `state`, or None for the terminal state."""
        return _timeout_table(self).get(state)

    def scaled(self, k: float) -> Timeouts:
        """Every timeout k times as long: a run at k simulated seconds per real
        second keeps the timeouts a real controller would have."""
        return Timeouts(*(getattr(self, f.name) * k for f in fields(self)))


@cache
def _timeout_table(t: Timeouts) -> dict[State, Timeout]:
    return {
        S.REQUESTED: Timeout(t.requested_timeout_s, T.EXPIRED),
        S.CREATING: Timeout(t.creating_timeout_s, T.EXPIRED),
        S.ACTIVE: Timeout(t.active_timeout_s, T.EXPIRED),
        S.READY: Timeout(t.ready_timeout_s, T.DRAIN_REQUESTED),
        S.NOTICED: Timeout(t.noticed_timeout_s, T.EXPIRED),
        S.DRAINING: Timeout(t.draining_timeout_s, T.EXPIRED),
        S.TERMINATING: Timeout(t.terminating_timeout_s, T.DELETE_RESENT),
        S.FAILED: Timeout(t.failed_timeout_s, T.DELETE_SENT),
    }


class IllegalTransition(ValueError):
    def __init__(self, state: State, trigger: Trigger) -> None:
        super().__init__(f"no edge from {state} on {trigger}")
        self.state = state
        self.trigger = trigger


def next_state(state: State, trigger: Trigger) -> State:
    """The state `trigger` moves `state` to; raises IllegalTransition off the table."""
    try:
        return EDGES[(state, trigger)]
    except KeyError:
        raise IllegalTransition(state, trigger) from None


def can(state: State, trigger: Trigger) -> bool:
    return (state, trigger) in EDGES
