"""The act phase of a partition's cycle: intents recorded first, then the scheduler and
the cloud told (drains, deletes), then creates: reserve, record, create, record the
outcome when it comes.

`Acquirer` carries the actions out for one partition. It keeps what outlives a
cycle: its creates and deletes in flight (`sco.engine.calls`), the pools'
back-off (a pure decision, `sco.decide.backoff`), and the replacements owed for
reclaimed spot; everything else it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from sco.decide import backoff
from sco.decide.acquirer import Actions, Create, Reason
from sco.domain.instances import Change, Instance, step
from sco.domain.lifecycle import State, Trigger
from sco.domain.plans import Plan
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot
from sco.domain.times import utc
from sco.engine.calls import Outbound
from sco.engine.clock import IdSource
from sco.engine.cycle import ControllerConfig, CycleTally
from sco.engine.records import PoolLedger, Records
from sco.engine.sync import Sightings
from sco.ports import (
    Clock,
    CreateResult,
    InsufficientCapacity,
    NewRequest,
    PermanentProviderError,
    Provider,
    ProviderError,
    QuotaExceeded,
    Reservation,
    RetryableProviderError,
    SchedulerCluster,
    SchedulerUnavailable,
)

log = logging.getLogger("sco.engine.controller")


class Acquirer:
    """Turns a partition's actions into writes and calls, and applies the answers."""

    def __init__(
        self,
        partition: str,
        *,
        provider: Provider,
        nodes: SchedulerCluster,
        records: Records,
        ledger: PoolLedger,
        sightings: Sightings,
        ids: IdSource,
        clock: Clock,
        config: ControllerConfig,
        calls: Executor,
        handed_back: Callable[[], bool] = lambda: False,
    ) -> None:
        """`handed_back`: whether the operator has handed the partition back, read
        when a create that waited for a worker is about to go out."""
        self.partition = partition
        self.handed_back = handed_back
        self.provider = provider
        self.nodes = nodes
        self.records = records
        self.ledger = ledger
        self.sightings = sightings
        self.ids = ids
        self.clock = clock
        self.config = config
        self.backoff = backoff.Backoff()
        self.owed = 0  # spot reclaimed and not yet replaced: creates count as replacements
        self.tally = CycleTally()  # the cycle under way, which answers count toward
        self._outbound = Outbound(calls)
        self._last_sweep = float("-inf")
        self._deleting: set[str] = set()  # TERMINATING records whose delete this one sent
        self._heir: Acquirer | None = None  # the one that took over its calls in flight

    def answers(self) -> int:
        """Apply the answers of calls sent by earlier cycles; returns the transitions."""
        return self._outbound.answers()

    def take_over(self, before: Acquirer) -> None:
        """The calls in flight of the partition's previous acquirer in this process:
        their answers are recorded here, on this one's records and under its lease (see
        `Outbound.take_over`)."""
        before._heir = self
        self._outbound.take_over(before._outbound)

    def _holder(self) -> Acquirer:
        """Who records the answers of the calls this one sent: itself, or the acquirer
        that took its calls over."""
        a = self
        while a._heir is not None:
            a = a._heir
        return a

    def act(self, actions: Actions, snapshot: PartitionSnapshot, plan: Plan, now: float) -> int:
        """Returns the transitions recorded."""
        records = self.records.held()
        changes: list[Change] = []
        acted = self.tally.acted
        noted = self.sightings.noted
        for e in actions.expirations:
            inst = records[e.instance_id]
            changes.append(step(inst, Trigger.EXPIRED, now, e.detail or e.reason, code=e.reason))
            acted[("expire", e.reason)] += 1
        for c in actions.closes:
            inst = records[c.instance_id]
            why = noted(inst, c.detail or c.reason)
            changes.append(step(inst, Trigger.SERVER_GONE, now, why, code=c.reason))
            acted[("close", c.reason)] += 1
        tell: list[tuple[str, float, str]] = []  # (server, deadline, reason) to drain
        for d in actions.drains:
            inst = records[d.instance_id]
            if inst.server_id:
                tell.append((inst.server_id, d.drain_by, str(d.reason)))
            acted[("drain", d.reason)] += 1
            if d.again:
                continue  # draining already: only its scheduler is told
            why = d.detail or f"{d.reason}: leave by {utc(d.drain_by)}"
            changes.append(
                step(inst, Trigger.DRAIN_REQUESTED, now, why, code=d.reason, drain_by=d.drain_by)
            )
        deletes = [(records[x.instance_id], x) for x in actions.deletes]
        for i, x in deletes:
            changes.append(step(i, x.trigger, now, noted(i, x.detail or x.reason), code=x.reason))
            acted[("delete", x.reason)] += 1
        # The intent is recorded first, then the scheduler and the cloud are told: a
        # write refused (a conflict, another leader) leaves no node drained that sco
        # still counts as ready, and none deleted; one told late is told again (`untold`).
        n = self.records.commit(changes)
        if changes and not n:
            return 0  # lost a race: the next cycle plans from what is there
        self._tell_drains(tell)
        self._delete([i.server_id for i, _ in deletes if i.server_id])
        for create in actions.creates:
            n += self._create(create, snapshot, plan)
        return n

    def sweep(self, now: float) -> None:
        """Drop stale reservations every `sweep_every_s`."""
        if now - self._last_sweep < self.config.sweep_every_s:
            return
        self._last_sweep = now
        self.records.sweep(now)

    # ------------------------------------------------------------ drains and deletes

    def _tell_drains(self, tell: Sequence[tuple[str, float, str]]) -> None:
        """Tell the scheduler of each drain just recorded; one it cannot take now is told
        again on a later cycle, as its node does not hold the order. A reclaim's work is
        then tended at once: a notice shorter than a cycle would otherwise reach its
        deadline before the next cycle requeues or evicts anything."""
        try:
            for server_id, drain_by, reason in tell:
                self.nodes.drain(self.partition, server_id, drain_by, reason)
            if any(reason == Reason.RECLAIM_NOTICE for _, _, reason in tell):
                self.nodes.tend(self.partition, None)
        except SchedulerUnavailable as e:
            log.warning("partition %s: drains not all sent, will resend: %s", self.partition, e)

    def _inherited(self, sending: Sequence[str]) -> list[str]:
        """Servers of TERMINATING records whose delete this controller never sent: a
        controller before it wrote them (another replica, or this one's process before
        a restart), and their delete may have died with it, unsent in its workers'
        queue. They are sent once more now, not at the record's timeout: until then the
        server lives on, counted by no plan, and its replacements put the partition
        over max_units. A delete sent twice deletes nothing more."""
        terminating = {
            i.id: i.server_id
            for i in self.records.held().values()
            if i.state is State.TERMINATING and i.server_id
        }
        resend = [
            sid
            for iid, sid in terminating.items()
            if iid not in self._deleting and sid not in sending
        ]
        self._deleting = set(terminating)
        return resend

    def _delete(self, server_ids: list[str]) -> None:
        """Delete servers whose TERMINATING records are already written: the intent
        is recorded first, so a controller whose lease was taken over (its write
        refused) deletes nothing, and a delete that fails is sent again when the
        record's timeout passes. The servers of TERMINATING records whose delete this
        controller never sent go with them (`_inherited`)."""
        server_ids = server_ids + self._inherited(server_ids)
        if not server_ids:
            return
        self._outbound.send(
            lambda: self.provider.delete(server_ids), lambda f: self._holder()._delete_answered(f)
        )

    def _delete_answered(self, future: Future[None]) -> int:
        try:
            future.result()
        except ProviderError as e:
            log.warning("partition %s: delete failed, will resend: %s", self.partition, e)
        return 0

    # ------------------------------------------------------------ creates

    def _create(self, create: Create, snapshot: PartitionSnapshot, plan: Plan) -> int:
        """Reserve, record REQUESTED, send the create (its answer recorded when it comes).
        Returns the transitions recorded. Nothing once a write of this cycle lost its
        race: what it planned from is stale."""
        if self.records.stale:
            return 0
        # The request's own time, not the cycle's: calls before it (a slow cloud) may
        # have taken a while, and the listing grace of its servers counts from here.
        now = self.clock.now()
        view = snapshot.pools[create.pool]
        fresh = self.ledger.read(now, fresh=True).get(create.pool)
        if fresh is None:
            return 0
        count = min(self.backoff.cap(create.pool, create.count), view.headroom - fresh.reserved)
        if count <= 0:
            return 0
        request_id = self.ids.new("req")
        pool = view.pool
        replacing = min(self.owed, count)
        codes = [Reason.REPLACE_RECLAIMED] * replacing + [create.reason] * (count - replacing)
        instances = tuple(
            Instance(
                id=self.ids.new("inst"),
                partition=self.partition,
                pool=pool.id,
                capacity_class=pool.capacity_class,
                units=pool.units_per_instance,
                state=State.REQUESTED,
                version=0,
                request_id=request_id,
                plan_generation=plan.generation,
                created_at=now,
                state_since=now,
                reason=str(code),
            )
            for code in codes
        )
        reservation = Reservation(
            request_id, pool.id, self.partition, count, now, now + self.config.reservation_ttl_s
        )
        if not self.records.reserve(NewRequest(reservation, instances, fresh.version)):
            return 0
        if log.isEnabledFor(logging.INFO):
            log.info(
                "partition %s: requesting %d in %s [%s] (request %s, plan %d)",
                self.partition, count, pool.id, ", ".join(sorted(set(codes))), request_id,
                plan.generation,
            )  # fmt: skip
        fence = self.records.fence.token
        sent = _Request(request_id, pool.id, instances, tuple(codes), replacing, now, fence)
        answered = self._outbound.send(
            lambda: self._send_create(sent, plan.generation),
            lambda future: self._holder()._create_answered(sent, future.result()),
        )
        return len(instances) + answered

    def _send_create(self, sent: _Request, plan_generation: int) -> _Answer:
        """The cloud's answer to a create, and when it came (it may run on a worker).
        Not sent when it waited for a worker until it no longer stands (`_stale_create`)."""
        late = self._stale_create(sent, self.clock.now())
        if late:
            log.info("partition %s: create %s not sent: %s", self.partition, sent.request_id, late)
            return _Answer(None, None, self.clock.now(), not_sent=late)
        try:
            result = self.provider.create(
                sent.pool, len(sent.instances), sent.request_id, self.partition, plan_generation
            )
        except (
            RetryableProviderError,
            InsufficientCapacity,
            QuotaExceeded,
            PermanentProviderError,
        ) as e:
            return _Answer(None, e, self.clock.now())
        return _Answer(result, None, self.clock.now())

    def _stale_create(self, sent: _Request, now: float) -> str:
        """Why a create that waited for a worker must not go out, if it must not: the
        partition's lease was let go meanwhile (another leader may act on it now), the
        operator handed it back (it creates nothing more), or half the listing grace
        has gone by (its records are closed at the grace, and a server made later
        would be a stranger the partition adopts over its target)."""
        if self.records.fence.token != sent.fence:
            return "the partition's lease was let go while it waited"
        if now > sent.at and self.handed_back():  # a read of fleet state: only once it waited
            return "the partition was handed back while it waited"
        waited = now - sent.at
        if waited >= self.config.list_grace_s / 2:
            return f"it waited {waited:.0f} s for a worker, past half the listing grace"
        return ""

    def _create_answered(self, sent: _Request, answer: _Answer) -> int:
        """Record a create's answer on the records as they are now: a listing may have
        settled some of them first (found by request id, or closed unanswered), and
        those are left as they are. Returns the transitions recorded."""
        name, request_id = self.partition, sent.request_id
        if answer.not_sent:
            if self.records.stale:
                return 0
            _, waiting = self._requested(sent)
            return self._refused(waiting, request_id, f"not sent: {answer.not_sent}", answer.at)
        if isinstance(answer.error, RetryableProviderError):
            # The outcome is unknown: records stay REQUESTED until listed or expired.
            log.warning("partition %s: create %s unknown: %s", name, request_id, answer.error)
            return 0
        if answer.error is not None:
            # Planning avoids the pool for a while.
            self.backoff = backoff.refused(self.backoff, sent.pool, sent.at)
        if self.records.stale:
            log.info("partition %s: answer to %s left to the listing", name, request_id)
            return 0
        current, waiting = self._requested(sent)
        if answer.error is not None:
            return self._refused(waiting, request_id, str(answer.error), sent.at)
        result = answer.result
        assert result is not None
        now = answer.at  # the answer's time: what it accepted was made by then
        open_ = request_id in self.records.open_requests
        if result.pending:
            # Taken: the records stay REQUESTED until their servers are listed.
            unsent = [i for i in current[result.pending :] if i and i.state is State.REQUESTED]
            refused = [
                step(i, Trigger.CREATE_FAILED, now, result.shortfall_reason or "not sent")
                for i in unsent
            ]
            settle = {request_id: result.pending} if refused and open_ else None
            recorded = self.records.commit(refused, settle)
            self._count_created(sent.codes[: result.pending], sent.replacing, sent.pool)
            return recorded
        held = {i.server_id for i in self.records.held().values() if i.server_id}
        new_ids = [sid for sid in result.server_ids if sid not in held]
        accepted = [
            step(inst, Trigger.CREATE_ACCEPTED, now, "create accepted", server_id=sid)
            for inst, sid in zip(waiting, new_ids, strict=False)
        ]
        refused = [
            step(inst, Trigger.CREATE_FAILED, now, result.shortfall_reason or "not accepted")
            for inst in waiting[len(new_ids) :]
        ]
        settle = {request_id: len(accepted)} if open_ else None
        if not accepted:
            self.records.open_requests.discard(request_id)
        recorded = self.records.commit(accepted + refused, settle)
        self._count_created(sent.codes[: len(accepted)], sent.replacing, sent.pool)
        return recorded

    def _requested(self, sent: _Request) -> tuple[list[Instance | None], list[Instance]]:
        """The request's records as they are now, and those still REQUESTED."""
        current = [self.records.get(i.id) for i in sent.instances]
        return current, [i for i in current if i is not None and i.state is State.REQUESTED]

    def _count_created(self, codes: Sequence[Reason], replacing: int, pool: PoolId) -> None:
        replaced = min(replacing, len(codes))
        self.tally.created += len(codes)
        # A cycle between the send and its answer may have cut what is owed already
        # (the request counted as live): owed never goes below nothing, or the next
        # create would make more records than it reserved.
        self.owed = max(0, self.owed - replaced)
        if replaced:
            self.tally.replaced[pool] += replaced
        for code in codes:
            self.tally.acted[("create", str(code))] += 1

    def _refused(self, instances: Sequence[Instance], request_id: str, why: str, now: float) -> int:
        log.info("partition %s: create %s refused: %s", self.partition, request_id, why)
        self.records.open_requests.discard(request_id)
        changes = [step(i, Trigger.CREATE_FAILED, now, why) for i in instances]
        return self.records.commit(changes, {request_id: 0})


@dataclass(frozen=True, slots=True)
class _Request:
    """A create sent: its request, records (REQUESTED when sent) and why each was made."""

    request_id: str
    pool: PoolId
    instances: tuple[Instance, ...]
    codes: tuple[Reason, ...]
    replacing: int  # of them, replacements of reclaimed spot
    at: float  # when it was sent
    fence: int  # the partition's fencing token then


@dataclass(frozen=True, slots=True)
class _Answer:
    result: CreateResult | None
    error: ProviderError | None
    at: float  # when it came
    not_sent: str = ""  # why it was never sent (the cloud was not asked)
