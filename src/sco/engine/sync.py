"""The sync phase of a partition's cycle: what was observed (the cloud's listing, the
scheduler's nodes) applied to the records: passive transitions, adoption of tagged
servers, servers that vanished, requests nobody answered, nodes lost."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from sco.domain.instances import Change, Instance, created, step
from sco.domain.lifecycle import HAS_SERVER, LIVE, State, Trigger
from sco.domain.pools import CapacityClass, PoolId
from sco.domain.snapshot import PartitionSnapshot
from sco.domain.times import utc
from sco.engine.partition_state import GONE, PartitionState
from sco.ports import (
    NodeView,
    ServerStatus,
    ServerView,
)

log = logging.getLogger("sco.engine.controller")


class Sync(PartitionState):
    def _sync(
        self,
        records: Mapping[str, Instance],
        servers: Sequence[ServerView],
        nodes: Mapping[str, NodeView],
        now: float,
    ) -> int:
        """Apply what was observed: passive transitions, adoption, disappearance."""
        by_server = {i.server_id: i for i in records.values() if i.server_id}
        requested: dict[str, list[Instance]] = {}
        for i in records.values():
            if i.state is State.REQUESTED:
                requested.setdefault(i.request_id, []).append(i)
        changes: list[Change] = []
        seen_requests: set[str] = set()
        # A server whose record, listing and node are as they were when it last gave
        # no transition gives none now: large fleets are mostly quiet.
        quiet = self._quiet
        calm: dict[str, tuple[Instance, ServerView, NodeView]] = {}
        unjoined: dict[str, float] = {}
        for view in servers:
            seen_requests.add(view.request_id)
            inst = by_server.get(view.server_id)
            if inst is None:
                waiting = requested.get(view.request_id)
                if waiting and view.refused:
                    # The scheduler could not place it: a refused create, whose server
                    # (it holds nothing) is deleted; the pool gets smaller batches.
                    ch = step(
                        waiting.pop(0),
                        Trigger.CREATE_FAILED,
                        now,
                        view.fault or "no valid host",
                        server_id=view.server_id,
                    )
                    self._refusals[view.pool] += 1
                    changes.append(ch)
                    continue
                if waiting:
                    ch = step(
                        waiting.pop(0),
                        Trigger.CREATE_ACCEPTED,
                        now,
                        "server found by request id",
                        server_id=view.server_id,
                    )
                    self._acceptances[view.pool] += 1
                else:
                    ch = created(
                        self._adopt(view, now), "tagged server without record", code="adopted"
                    )
                changes.append(ch)
                inst = ch.after
            looked = (inst, view, nodes.get(view.server_id, GONE))
            if quiet.get(view.server_id) != looked:
                seen = self._observed(*looked, now)
                if seen:
                    changes.extend(seen)
                    continue
            lost = self._lost(inst, looked[2], now, unjoined)
            if lost is not None:
                changes.append(lost)
                continue
            if view.server_id not in unjoined:
                calm[view.server_id] = looked  # one not joined is looked at every cycle
        self._quiet = calm
        self._unjoined = unjoined
        listed = {v.server_id for v in servers}
        for sid in by_server.keys() - listed:
            inst = by_server[sid]
            if inst.state in HAS_SERVER:
                # Since the create was answered (a slow answer must not eat the grace).
                young = now - inst.state_since < self.config.list_grace_s
                if young and inst.state is State.CREATING and sid not in self._seen:
                    continue  # a create's servers may not be listed yet; a listed one was
                changes.append(self._vanished(inst, now))
        # Servers seen in a listing, of the records held: their absence is news at once.
        self._seen = (self._seen | listed) & (by_server.keys() | listed)
        unanswered = self._unanswered(requested, now)
        changes.extend(unanswered)
        observed = seen_requests & self._open_requests
        self._open_requests -= observed
        settled = observed | {ch.after.request_id for ch in unanswered}
        n = self._commit(changes, dict.fromkeys(settled, 0))
        if n:
            self._note_reclaims(changes)
        self._adapt_batches()
        return n

    def _note_no_room(
        self, targets: Mapping[PoolId, int], snapshot: PartitionSnapshot, now: float
    ) -> None:
        """A pool the plan wants more in but that has no room refuses as a launch there
        would: the next snapshot says so (`PoolView.last_refusal_at`), and policies that
        avoid pools that refused (SpotHedge) learn of it."""
        short = [p for p, n in targets.items() if n and p in snapshot.pools]
        if not short:
            return
        live = Counter([i.pool for i in snapshot.instances if i.state in LIVE])
        for p in short:
            if targets[p] > live[p] and snapshot.pools[p].available == 0:
                self._refused_at[p] = now

    def _adapt_batches(self) -> None:
        """Halve a pool's batch on refusals (its scheduler places all of a batch or none),
        double it back on acceptances, as Cluster Autoscaler backs off and recovers."""
        top = self.config.act.max_batch
        for pool, n in self._refusals.items():
            self._refused_at[pool] = self.clock.now()
            self._batch[pool] = max(1, min(self._batch.get(pool, top), n) // 2)
            log.info(
                "partition %s: %d refused in %s (no valid host); batches of %d there now",
                self.partition.name,
                n,
                pool,
                self._batch[pool],
            )
        for pool in self._acceptances.keys() - self._refusals.keys():
            if pool in self._batch:
                if self._batch[pool] * 2 >= top:
                    del self._batch[pool]  # recovered: batches follow the room again
                else:
                    self._batch[pool] *= 2
        self._refusals.clear()
        self._acceptances.clear()

    def _note_reclaims(self, changes: Sequence[Change]) -> None:
        """Reclaims just recorded: the shared signals count them at once, the metrics
        by pool and kind, and each spot one is owed a replacement."""
        for ch in changes:
            if ch.trigger in _RECLAIMED and ch.before is not None:
                if ch.before.notice_deadline is not None:
                    continue  # noticed before: counted at the first notice
                kind = "notice" if ch.trigger is Trigger.RECLAIM_NOTICE else "vanished"
                self._cycle.reclaims[(ch.after.pool, kind)] += 1
                if ch.after.is_spot:
                    self.signals.note_reclaim(ch.after.pool, ch.after.id, ch.at)
                    if ch.before.state in LIVE:  # capacity it was: a replacement is owed
                        self._owed += 1

    def _unanswered(self, requested: Mapping[str, list[Instance]], now: float) -> list[Change]:
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
            if now - inst.created_at >= self.config.list_grace_s
        ]

    def _adopt(self, view: ServerView, now: float) -> Instance:
        pool = self._pools.get(view.pool)
        if pool is None:
            log.warning("adopting %s in unknown pool %s", view.server_id, view.pool)
        state = State.ACTIVE if view.status is ServerStatus.ACTIVE else State.CREATING
        return Instance(
            id=self.ids.new("inst"),
            partition=self.partition.name,
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

    def _observed(
        self, inst: Instance, view: ServerView, node: NodeView, now: float
    ) -> list[Change]:
        """Passive transitions of one listed server, chained (CREATING may reach READY)."""
        out: list[Change] = []

        def go(trigger: Trigger, reason: str, **fields: Any) -> None:
            nonlocal inst
            ch = step(inst, trigger, now, reason, **fields)
            out.append(ch)
            inst = ch.after

        if view.refused and inst.state is State.CREATING:
            self._refusals[view.pool] += 1  # listed first while the scheduler still tried
            go(Trigger.CREATE_FAILED, view.fault or "no valid host")
            return out
        if view.status is ServerStatus.ERROR and inst.state in _CAN_ERROR:
            go(Trigger.SERVER_ERROR, view.fault or "server in ERROR")
            return out
        deadline = view.notice_deadline
        if deadline is not None and _notice_is_news(inst, deadline):
            go(
                Trigger.RECLAIM_NOTICE,
                f"reclaim notice: leave by {utc(deadline)}",
                notice_deadline=deadline,
            )
            return out
        if view.status is ServerStatus.ACTIVE and inst.state is State.CREATING:
            go(Trigger.SERVER_ACTIVE, "server ACTIVE")
        if node.joined and inst.state is State.ACTIVE:
            go(Trigger.NODE_JOINED, "node joined its scheduler")
            self._cycle.delays.append(self._ready_delay(inst, view, node, now))
        return out

    def _lost(
        self, inst: Instance, node: NodeView, now: float, unjoined: dict[str, float]
    ) -> Change | None:
        """A READY node its scheduler has not listed as up since `node_lost_after_s` ago
        fails (it is deleted and replaced). Counted from the first cycle this controller
        saw it so, which a new leader starts again: late, never early."""
        if inst.state is not State.READY or node.joined or inst.server_id is None:
            return None
        since = self._unjoined.get(inst.server_id, now)
        if now - since < self.config.node_lost_after_s:
            unjoined[inst.server_id] = since
            return None
        why = f"node out of its scheduler (not listed, or down) for {now - since:.0f}s"
        return step(inst, Trigger.NODE_LOST, now, why)

    @staticmethod
    def _ready_delay(inst: Instance, view: ServerView, node: NodeView, now: float) -> float:
        """From the request to the node being ready, by the provider's or scheduler's own
        clock when it says (not the cycle that happened to see it), within what the
        controller's clock allows."""
        ready = node.joined_at if node.joined_at is not None else view.active_at
        if ready is None:
            ready = now
        return min(max(0.0, ready - inst.created_at), max(0.0, now - inst.created_at))

    def _vanished(self, inst: Instance, now: float) -> Change:
        if inst.state in (State.TERMINATING, State.FAILED):
            return step(inst, Trigger.SERVER_GONE, now, self._noted(inst, "server deleted"))
        why = self._noted(inst, "server vanished without our delete")
        return step(inst, Trigger.SERVER_VANISHED, now, why)


def _notice_is_news(inst: Instance, deadline: float) -> bool:
    """A reclaim notice the record does not hold yet: the first one (whatever state the
    instance is in, draining included), or one with a sooner deadline: the sooner wins."""
    if inst.state not in _CAN_NOTICE:
        return False
    return inst.notice_deadline is None or deadline < inst.notice_deadline


_CAN_ERROR = frozenset({State.CREATING, State.ACTIVE, State.READY})
_CAN_NOTICE = frozenset({State.CREATING, State.ACTIVE, State.READY, State.NOTICED, State.DRAINING})
_RECLAIMED = frozenset({Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED})
