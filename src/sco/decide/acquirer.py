"""Acquirer and replacer: the difference between targets and instances, as actions.

Pure: `diff` reads a snapshot and the plan's targets and returns what to do.
Rules it keeps, whatever the inputs:
- never ask a pool for more than its available headroom (headroom minus
  everyone's pending reservations);
- never take READY capacity below the floor by its own choice (reclaims and
  failures are not its choice);
- move spot make-before-break: a ready spot node over its pool's target is
  drained only while the partition keeps at least what it wants ready;
- a noticed instance no longer counts, so its replacement starts at the
  notice, and it is drained to leave by its deadline;
- a node is drained before its server is deleted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum

from sco.domain.instances import Instance, expired
from sco.domain.lifecycle import LIVE, State, Timeouts, Trigger
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class ActConfig:
    max_batch: int = 10  # instances in one create call, at least
    batch_fraction: float = 0.25  # ... or this share of the pool's room, when more
    drain_s: float = 60.0  # time a node gets to leave when sco removes it
    timeouts: Timeouts = field(default_factory=Timeouts)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.drain_s < 0:
            raise ValueError(f"drain_s must be >= 0, got {self.drain_s}")
        if not 0 <= self.batch_fraction <= 1:
            raise ValueError(f"batch_fraction must be in [0, 1], got {self.batch_fraction}")

    def batch(self, available: int) -> int:
        """Instances one create call may ask for in a pool with `available` room: a
        fleet refills a lost zone in a few calls, not hundreds of ten."""
        return max(self.max_batch, math.ceil(available * self.batch_fraction))


class Reason(StrEnum):
    """Why an action is taken: the code every create, drain, delete, expiry and close
    carries into its transition, its log line and the acting metrics."""

    PLAN_WANTS_MORE = "plan_wants_more"  # the plan wants more in a pool than is live there
    REPLACE_RECLAIMED = "replace_reclaimed"  # the same, to replace what a reclaim took
    OVER_TARGET = "over_target"  # a pool holds more than the plan wants there
    RECLAIM_NOTICE = "reclaim_notice"  # the provider announced a reclaim: leave by then
    NODE_DRAINED = "node_drained"  # the node left its scheduler: its server can go
    DRAIN_DEADLINE = "drain_deadline"  # the node did not leave in time: the server goes
    SERVER_FAILED = "server_failed"  # the server errored or was refused
    TIMED_OUT = "timed_out"  # the state's timeout elapsed
    NO_SERVER = "no_server"  # a failed record that never had a server: close it
    HANDBACK = "handback"  # the operator handed the partition back
    UNTOLD = "drain_untold"  # a draining node's scheduler does not hold the order: again


@dataclass(frozen=True, slots=True)
class Create:
    pool: PoolId
    count: int
    reason: Reason = Reason.PLAN_WANTS_MORE


@dataclass(frozen=True, slots=True)
class Drain:
    """Tell a node to leave by `drain_by`; `again`: the record says so already (it is
    draining) and only its scheduler is told, anew."""

    instance_id: str
    drain_by: float
    reason: Reason
    detail: str = ""
    again: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    instance_id: str
    trigger: Trigger  # DELETE_SENT or DELETE_RESENT
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Expire:
    instance_id: str
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Close:
    """A failed record whose server never existed: nothing to delete."""

    instance_id: str
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Actions:
    creates: tuple[Create, ...] = ()
    drains: tuple[Drain, ...] = ()
    deletes: tuple[Delete, ...] = ()
    expirations: tuple[Expire, ...] = ()
    closes: tuple[Close, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.creates or self.drains or self.deletes or self.expirations or self.closes)


def diff(
    snapshot: PartitionSnapshot,
    targets: Mapping[PoolId, int],
    cfg: ActConfig,
    drained: Set[str] = frozenset(),
    removal: Reason = Reason.OVER_TARGET,
    busy: Set[str] = frozenset(),
    pinned: Set[str] = frozenset(),
    untold: Set[str] = frozenset(),
    batches: Mapping[PoolId, int] | None = None,
) -> Actions:
    """What to create, drain, delete, expire and close so instances move toward `targets`.

    `drained` holds the ids of draining instances whose nodes have left; `removal` is
    the reason given for taking away what is over target; `busy` the instances whose
    nodes run work, the last to be taken away; `pinned` those whose nodes run work
    that only a reclaim may disrupt: never taken away to meet a target, and a drain
    sco began for its own reasons waits for that work rather than ending at its
    deadline; `untold` the draining instances whose schedulers do not hold their order
    to leave (or not its reclaim deadline): they are told again; `batches` per pool the
    fewest a create there asks for (a gang's nodes, together), within the room.
    """
    now = snapshot.now
    acts = _Acc()
    handled: set[str] = set()
    # Ready nodes neither time out (by default) nor leave: a fleet is mostly ready.
    ready_stays = cfg.timeouts.ready_timeout_s == math.inf
    moving = [i for i in snapshot.instances if not (ready_stays and i.state is State.READY)]
    for inst in moving:
        if _held(inst, pinned):
            continue  # the work it waits for is its scheduler's to end, not a stuck drain
        if _timed_out(inst, now, cfg.timeouts, acts):
            handled.add(inst.id)
    for inst in moving:
        if inst.id not in handled:
            _leaving(inst, now, drained, pinned, acts, untold)
    _toward_targets(snapshot, targets, cfg, handled, acts, removal, busy, pinned, batches)
    return acts.freeze()


def _held(inst: Instance, pinned: Set[str]) -> bool:
    """A drain sco began for its own reasons, held by pinned work (no reclaim)."""
    return inst.state is State.DRAINING and inst.id in pinned and inst.notice_deadline is None


@dataclass
class _Acc:
    creates: list[Create] = field(default_factory=list)
    drains: list[Drain] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    expirations: list[Expire] = field(default_factory=list)
    closes: list[Close] = field(default_factory=list)

    def freeze(self) -> Actions:
        return Actions(
            tuple(self.creates),
            tuple(self.drains),
            tuple(self.deletes),
            tuple(self.expirations),
            tuple(self.closes),
        )


def _timed_out(inst: Instance, now: float, timeouts: Timeouts, acts: _Acc) -> bool:
    trigger = expired(inst, now, timeouts)
    if trigger is None or trigger is Trigger.DRAIN_REQUESTED:
        return False
    why = f"{inst.state} timed out"
    if trigger is Trigger.EXPIRED:
        acts.expirations.append(Expire(inst.id, Reason.TIMED_OUT, why))
    elif inst.state is State.FAILED and inst.server_id is None:
        acts.closes.append(Close(inst.id, Reason.NO_SERVER, "no server was created"))
    else:
        acts.deletes.append(Delete(inst.id, trigger, Reason.TIMED_OUT, why))
    return True


def _leaving(
    inst: Instance,
    now: float,
    drained: Set[str],
    pinned: Set[str],
    acts: _Acc,
    untold: Set[str] = frozenset(),
) -> None:
    """Instances on their way out: noticed, draining, failed."""
    if inst.state is State.NOTICED:
        # The reclaim's deadline, the soonest notice's: a drain sco began for its own
        # reasons had a deadline pinned work could hold; a reclaim's cannot be held.
        drain_by = inst.notice_deadline if inst.notice_deadline is not None else now
        acts.drains.append(Drain(inst.id, drain_by, Reason.RECLAIM_NOTICE))
    elif inst.state is State.DRAINING:
        if inst.id in drained:
            acts.deletes.append(Delete(inst.id, Trigger.DELETE_SENT, Reason.NODE_DRAINED))
        elif inst.drain_by is not None and now >= inst.drain_by:
            if inst.id in pinned and inst.notice_deadline is None:
                return  # sco's own move: the pinned work holds it (a reclaim never waits)
            acts.deletes.append(Delete(inst.id, Trigger.DELETE_SENT, Reason.DRAIN_DEADLINE))
        elif inst.id in untold and inst.drain_by is not None:
            reclaim = inst.notice_deadline is not None
            acts.drains.append(
                Drain(
                    inst.id,
                    inst.drain_by,
                    Reason.RECLAIM_NOTICE if reclaim else Reason.UNTOLD,
                    "its scheduler does not hold the order to leave: told again",
                    again=True,
                )
            )
    elif inst.state is State.FAILED:
        if inst.server_id is None:
            acts.closes.append(Close(inst.id, Reason.NO_SERVER, "no server was created"))
        else:
            acts.deletes.append(
                Delete(inst.id, Trigger.DELETE_SENT, Reason.SERVER_FAILED, inst.reason)
            )


# Cheapest to give up first: an idle node before a busy one; not yet a server, then not
# yet a node, then the newest ready.
_REMOVAL_ORDER = {State.CREATING: 0, State.ACTIVE: 1, State.READY: 2}


def _toward_targets(
    snapshot: PartitionSnapshot,
    targets: Mapping[PoolId, int],
    cfg: ActConfig,
    handled: Set[str],
    acts: _Acc,
    why: Reason,
    busy: Set[str] = frozenset(),
    pinned: Set[str] = frozenset(),
    batches: Mapping[PoolId, int] | None = None,
) -> None:
    live: dict[PoolId, list[Instance]] = defaultdict(list)
    ready_units = 0
    for inst in snapshot.instances:
        if inst.state in LIVE and inst.id not in handled:
            live[inst.pool].append(inst)
            if inst.state is State.READY:
                ready_units += inst.units
    floor = snapshot.demand.floor_units
    keep_for_spot = max(floor, snapshot.demand.wanted_units)
    for pool_id in sorted(set(targets) | set(live)):
        want = targets.get(pool_id, 0)
        have = live.get(pool_id, [])
        if len(have) < want:
            view = snapshot.pools.get(pool_id)
            room = view.available if view else 0
            batch = max(cfg.batch(room), (batches or {}).get(pool_id, 0))
            n = min(want - len(have), room, batch)
            if n > 0:
                acts.creates.append(Create(pool_id, n))
        elif len(have) > want:
            surplus = len(have) - want
            victims = sorted(
                (i for i in have if i.state in _REMOVAL_ORDER and i.id not in pinned),
                key=lambda i: (i.id in busy, _REMOVAL_ORDER[i.state], -i.created_at, i.id),
            )
            for inst in victims[:surplus]:
                if inst.state is State.READY:
                    if ready_units - inst.units < (keep_for_spot if inst.is_spot else floor):
                        continue  # the floor outranks the plan; spot moves only once replaced
                    ready_units -= inst.units
                    acts.drains.append(Drain(inst.id, snapshot.now + cfg.drain_s, why))
                else:
                    acts.deletes.append(Delete(inst.id, Trigger.DELETE_SENT, why))
