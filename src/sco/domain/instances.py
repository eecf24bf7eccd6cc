"""Instance records and the pure step that moves one along the lifecycle table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sco.domain.lifecycle import LIVE, State, Timeouts, Trigger, next_state
from sco.domain.pools import CapacityClass, PoolId


@dataclass(frozen=True, slots=True)
class Instance:
    """One server sco created (or adopted), as fleet state records it.

    `version` is the compare-and-swap counter: every persisted change bumps it.
    Times are seconds since the epoch of the clock in use.
    """

    id: str
    partition: str
    pool: PoolId
    capacity_class: CapacityClass
    units: int
    state: State
    version: int
    request_id: str
    plan_generation: int
    created_at: float
    state_since: float
    server_id: str | None = None
    ready_at: float | None = None
    drain_by: float | None = None
    notice_deadline: float | None = None
    reason: str = ""

    @property
    def is_spot(self) -> bool:
        return self.capacity_class is CapacityClass.SPOT

    @property
    def is_live(self) -> bool:
        return self.state in LIVE

    @property
    def is_ready(self) -> bool:
        return self.state is State.READY


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded transition: the record before and after, and why."""

    before: Instance | None  # None when the record is created (requested or adopted)
    after: Instance
    trigger: Trigger | None  # None for creation; adoption says so in `reason`
    at: float
    reason: str
    code: str = ""  # the reason code (an action's `Reason`); "" means the trigger's name


def step(
    instance: Instance, trigger: Trigger, at: float, reason: str, *, code: str = "", **fields: Any
) -> Change:
    """Move `instance` along the edge named by `trigger`, setting `fields` too; `code` is
    the reason code recorded with it (default: the trigger's name).

    Raises IllegalTransition when the table has no such edge.
    """
    to = next_state(instance.state, trigger)
    if fields and not fields.keys() <= _KNOWN:
        raise TypeError(f"Instance has no field {sorted(fields.keys() - _KNOWN)}")
    changes: dict[str, Any] = {"version": instance.version + 1, "reason": reason, **fields}
    if to is not instance.state:
        changes["state"] = to
        changes["state_since"] = at
    if to is State.READY and instance.ready_at is None:
        changes["ready_at"] = at
    after = Instance(*[changes[n] if n in changes else getattr(instance, n) for n in _FIELDS])
    return Change(instance, after, trigger, at, reason, code or trigger.value)


# `dataclasses.replace` by position: half its cost, and a transition is the engine's
# commonest act (a simulated fleet day makes hundreds of thousands). Every field of
# Instance is an __init__ argument, in this order.
_FIELDS = tuple(f.name for f in dataclasses.fields(Instance))
_KNOWN = frozenset(_FIELDS)


def created(instance: Instance, reason: str, code: str = "created") -> Change:
    """The change that brings a new record into fleet state."""
    return Change(None, instance, None, instance.created_at, reason, code)


def expired(instance: Instance, now: float, timeouts: Timeouts) -> Trigger | None:
    """The trigger a state's timeout fires for `instance` at `now`, if it has run out.

    A draining node's deadline is its own `drain_by` when that is later.
    """
    timeout = timeouts.for_state(instance.state)
    if timeout is None:
        return None
    limit = instance.state_since + timeout.after_s
    if instance.state is State.DRAINING and instance.drain_by is not None:
        limit = max(limit, instance.drain_by + timeout.after_s)
    return timeout.trigger if now >= limit else None


def units(instances: Iterable[Instance]) -> int:
    return sum(i.units for i in instances)
