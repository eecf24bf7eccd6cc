"""The sync phase of a partition's cycle: what was observed (the cloud's listing, the
scheduler's nodes) turned into changes of the records: passive transitions, adoption
of tagged servers, servers that vanished, requests nobody answered, nodes lost.

`sync` decides; the controller commits what it returns. Between cycles the phase
remembers what it saw (`Sightings`), which it alone reads and writes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sco.domain.instances import Change, Instance, created, step
from sco.domain.lifecycle import HAS_SERVER, State, Trigger
from sco.domain.pools import CapacityClass, Pool, PoolId
from sco.domain.times import utc
from sco.engine.clock import IdSource
from sco.ports import NodeView, ServerStatus, ServerView

log = logging.getLogger("sco.engine.controller")
GONE = NodeView(joined=False, drained=False)


@dataclass
class Sightings:
    """What earlier listings showed, as the sync phase keeps it between cycles."""

    # A server whose record, listing and node are as they were when it last gave no
    # transition gives none now: large fleets are mostly quiet.
    quiet: dict[str, tuple[Instance, ServerView, NodeView]] = field(default_factory=dict)
    unjoined: dict[str, float] = field(default_factory=dict)  # server -> first cycle not joined
    seen: set[str] = field(default_factory=set)  # server ids some listing showed
    notes: dict[str, str] = field(default_factory=dict)  # server -> what leaving cuts short

    def keep_notes(
        self, servers: Sequence[ServerView], nodes: Mapping[str, NodeView], live: Sequence[Instance]
    ) -> None:
        """Remember what the scheduler said of each node until its server's end is
        recorded: a reclaimed server is often gone from the listing by then."""
        notes = self.notes
        notes.update({s: v.note for s, v in nodes.items() if v.note})
        keep = {i.server_id for i in live if i.server_id} | {v.server_id for v in servers}
        for s in [s for s in notes if s not in keep]:
            del notes[s]

    def noted(self, inst: Instance, why: str) -> str:
        """`why` with what the scheduler said leaving cuts short (jobs it could not
        requeue), so that the event of the node's end reports it."""
        note = self.notes.get(inst.server_id or "")
        return f"{why}; {note}" if note else why


@dataclass(frozen=True, slots=True)
class Partners:
    """What the sync phase needs of its partition: its name and pools (to adopt tagged
    servers), ids for adopted records, and the listing's grace and a lost node's time."""

    partition: str
    pools: Mapping[PoolId, Pool]
    ids: IdSource
    list_grace_s: float
    node_lost_after_s: float


@dataclass
class Synced:
    """What a listing changes: the changes to commit (and the requests they settle), the
    requests now seen, refusals and acceptances by pool (for the back-off), and the
    request-to-ready delays of instances that became ready."""

    changes: list[Change] = field(default_factory=list)
    seen_requests: set[str] = field(default_factory=set)
    unanswered: list[Change] = field(default_factory=list)
    refusals: Counter[PoolId] = field(default_factory=Counter)
    acceptances: Counter[PoolId] = field(default_factory=Counter)
    delays: list[float] = field(default_factory=list)


def sync(
    records: Mapping[str, Instance],
    servers: Sequence[ServerView],
    nodes: Mapping[str, NodeView],
    now: float,
    sightings: Sightings,
    partners: Partners,
) -> Synced:
    """Apply what was observed: passive transitions, adoption, disappearance."""
    out = Synced()
    by_server = {i.server_id: i for i in records.values() if i.server_id}
    requested: dict[str, list[Instance]] = {}
    for i in records.values():
        if i.state is State.REQUESTED:
            requested.setdefault(i.request_id, []).append(i)
    calm: dict[str, tuple[Instance, ServerView, NodeView]] = {}
    unjoined: dict[str, float] = {}
    for view in servers:
        out.seen_requests.add(view.request_id)
        inst = by_server.get(view.server_id)
        if inst is None:
            first = _first_sight(view, requested.get(view.request_id), now, out, partners)
            out.changes.append(first)
            if first.trigger is Trigger.CREATE_FAILED:
                continue
            inst = first.after
        looked = (inst, view, nodes.get(view.server_id, GONE))
        if sightings.quiet.get(view.server_id) == looked:
            # As calm as last cycle: nothing to observe, and not a READY node its
            # scheduler lacks (that one is not calm), so not lost either.
            calm[view.server_id] = looked
            continue
        seen = _observed(*looked, now, out)
        if seen:
            out.changes.extend(seen)
            continue
        lost = _lost(inst, looked[2], now, sightings.unjoined, unjoined, partners)
        if lost is not None:
            out.changes.append(lost)
            continue
        if view.server_id not in unjoined:
            calm[view.server_id] = looked  # one not joined is looked at every cycle
    sightings.quiet = calm
    sightings.unjoined = unjoined
    listed = {v.server_id for v in servers}
    for sid in by_server.keys() - listed:
        inst = by_server[sid]
        if inst.state in HAS_SERVER:
            # Since the create was answered (a slow answer must not eat the grace).
            young = now - inst.state_since < partners.list_grace_s
            if young and inst.state is State.CREATING and sid not in sightings.seen:
                continue  # a create's servers may not be listed yet; a listed one was
            out.changes.append(_vanished(inst, now, sightings))
    # Servers seen in a listing, of the records held: their absence is news at once.
    sightings.seen = (sightings.seen | listed) & (by_server.keys() | listed)
    out.unanswered = _unanswered(requested, now, partners.list_grace_s)
    out.changes.extend(out.unanswered)
    return out


def _first_sight(
    view: ServerView,
    waiting: list[Instance] | None,
    now: float,
    out: Synced,
    partners: Partners,
) -> Change:
    """A listed server no record holds: a refused create's (its server holds nothing
    and is deleted; the pool gets smaller batches), the answer to a request still
    REQUESTED, or a tagged server without a record, which is adopted."""
    if waiting and view.refused:
        out.refusals[view.pool] += 1
        why = view.fault or "no valid host"
        return step(waiting.pop(0), Trigger.CREATE_FAILED, now, why, server_id=view.server_id)
    if waiting:
        out.acceptances[view.pool] += 1
        why = "server found by request id"
        return step(waiting.pop(0), Trigger.CREATE_ACCEPTED, now, why, server_id=view.server_id)
    return created(_adopt(view, now, partners), "tagged server without record", code="adopted")


def _observed(
    inst: Instance, view: ServerView, node: NodeView, now: float, out: Synced
) -> list[Change]:
    """Passive transitions of one listed server, chained (CREATING may reach READY)."""
    done: list[Change] = []

    def go(trigger: Trigger, reason: str, **fields: Any) -> None:
        nonlocal inst
        ch = step(inst, trigger, now, reason, **fields)
        done.append(ch)
        inst = ch.after

    if view.refused and inst.state is State.CREATING:
        out.refusals[view.pool] += 1  # listed first while the scheduler still tried
        go(Trigger.CREATE_FAILED, view.fault or "no valid host")
        return done
    if view.status is ServerStatus.ERROR and inst.state in _CAN_ERROR:
        go(Trigger.SERVER_ERROR, view.fault or "server in ERROR")
        return done
    deadline = view.notice_deadline
    if deadline is not None and _notice_is_news(inst, deadline):
        go(
            Trigger.RECLAIM_NOTICE,
            f"reclaim notice: leave by {utc(deadline)}",
            notice_deadline=deadline,
        )
        return done
    if view.status is ServerStatus.ACTIVE and inst.state is State.CREATING:
        go(Trigger.SERVER_ACTIVE, "server ACTIVE")
    if node.joined and inst.state is State.ACTIVE:
        go(Trigger.NODE_JOINED, "node joined its scheduler")
        out.delays.append(_ready_delay(inst, view, node, now))
    return done


def _lost(
    inst: Instance,
    node: NodeView,
    now: float,
    before: Mapping[str, float],
    unjoined: dict[str, float],
    partners: Partners,
) -> Change | None:
    """A READY node its scheduler has not listed as up since `node_lost_after_s` ago
    fails (it is deleted and replaced). Counted from the first cycle this controller
    saw it so, which a new leader starts again: late, never early."""
    if inst.state is not State.READY or node.joined or inst.server_id is None:
        return None
    since = before.get(inst.server_id, now)
    if now - since < partners.node_lost_after_s:
        unjoined[inst.server_id] = since
        return None
    why = f"node out of its scheduler (not listed, or down) for {now - since:.0f}s"
    return step(inst, Trigger.NODE_LOST, now, why)


def _ready_delay(inst: Instance, view: ServerView, node: NodeView, now: float) -> float:
    """From the request to the node being ready, by the provider's or scheduler's own
    clock when it says (not the cycle that happened to see it), within what the
    controller's clock allows."""
    ready = node.joined_at if node.joined_at is not None else view.active_at
    if ready is None:
        ready = now
    return min(max(0.0, ready - inst.created_at), max(0.0, now - inst.created_at))


def _vanished(inst: Instance, now: float, sightings: Sightings) -> Change:
    if inst.state in (State.TERMINATING, State.FAILED):
        return step(inst, Trigger.SERVER_GONE, now, sightings.noted(inst, "server deleted"))
    why = sightings.noted(inst, "server vanished without our delete")
    return step(inst, Trigger.SERVER_VANISHED, now, why)


def _unanswered(
    requested: Mapping[str, list[Instance]], now: float, grace_s: float
) -> list[Change]:
    """REQUESTED records no listed server answers, once the listing grace has passed:
    the request was refused or lost, its sender died (another controller's), or its
    servers came and went between two listings (a reclaim before we looked). They
    are closed now rather than holding the partition short until their timeout; a
    server that shows up later is adopted by its tags."""
    return [
        step(
            inst,
            Trigger.EXPIRED,
            now,
            "no server listed for its request within the listing grace",
            code="unanswered",
        )
        for waiting in requested.values()
        for inst in waiting
        if now - inst.created_at >= grace_s
    ]


def _adopt(view: ServerView, now: float, partners: Partners) -> Instance:
    pool = partners.pools.get(view.pool)
    if pool is None:
        log.warning("adopting %s in unknown pool %s", view.server_id, view.pool)
    state = State.ACTIVE if view.status is ServerStatus.ACTIVE else State.CREATING
    return Instance(
        id=partners.ids.new("inst"),
        partition=partners.partition,
        pool=view.pool,
        capacity_class=pool.capacity_class if pool else CapacityClass.SPOT,
        units=pool.units_per_instance if pool else 1,
        state=state,
        version=0,
        request_id=view.request_id,
        plan_generation=view.plan_generation,
        created_at=view.created_at,
        state_since=now,
        server_id=view.server_id,
        reason="adopted",
    )


def reclaims(changes: Sequence[Change]) -> list[tuple[Change, str]]:
    """The reclaims among `changes`, each once (a notice, or a vanishing not noticed
    before), with its kind: "notice" or "vanished"."""
    out = []
    for ch in changes:
        if ch.trigger in _RECLAIMED and ch.before is not None:
            if ch.before.notice_deadline is not None:
                continue  # noticed before: counted at the first notice
            out.append((ch, "notice" if ch.trigger is Trigger.RECLAIM_NOTICE else "vanished"))
    return out


def _notice_is_news(inst: Instance, deadline: float) -> bool:
    """A reclaim notice the record does not hold yet: the first one (whatever state the
    instance is in, draining included), or one with a sooner deadline: the sooner wins."""
    if inst.state not in _CAN_NOTICE:
        return False
    return inst.notice_deadline is None or deadline < inst.notice_deadline


_CAN_ERROR = frozenset({State.CREATING, State.ACTIVE, State.READY})
_CAN_NOTICE = frozenset({State.CREATING, State.ACTIVE, State.READY, State.NOTICED, State.DRAINING})
_RECLAIMED = frozenset({Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED})
