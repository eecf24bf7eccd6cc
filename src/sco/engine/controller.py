"""One controller per partition: observe, sync, plan, arbitrate, act, publish.

Decisions are the pure functions of `sco.decide`; this module does the I/O
around them, by composition: the partition's `Records` (its one writer's cache,
every write a compare-and-swap carrying the lease's fencing token), the sync
phase (`sync`, with what it remembers of listings), the plan phase (`planning`)
and the `Acquirer` (the act phase, with its calls in flight and back-off).

Controllers are made by `sco.engine.builder` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from sco.decide import backoff
from sco.decide.acquirer import Actions, Reason, diff
from sco.decide.policies import Decision, Policy
from sco.domain.demand import HANDBACK, Demand, Partition
from sco.domain.instances import Change, Instance
from sco.domain.lifecycle import LIVE, State
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.engine.act import Acquirer
from sco.engine.clock import IdSource
from sco.engine.cycle import (
    ControllerConfig,
    CycleReport,
    CycleTally,
    by_class_and_state,
    placement_of,
)
from sco.engine.planning import MadeOf, next_plan, snapshot_of
from sco.engine.records import PoolLedger, Records, RecordStore
from sco.engine.signals import FleetSignals
from sco.engine.sync import GONE, Partners, Sightings, reclaims, sync
from sco.engine.tokens import TokenIssuer, tokenless
from sco.ports import (
    Clock,
    DemandSource,
    Fence,
    NodeView,
    Provider,
    ProviderError,
    SchedulerCluster,
    SchedulerUnavailable,
    ServerView,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Partitioned:
    """What a partition's controller works with, besides its records: the cloud, its
    scheduler's node plane, the demand, the shared signals, names and time."""

    provider: Provider
    nodes: SchedulerCluster
    demand: DemandSource
    signals: FleetSignals
    clock: Clock
    ids: IdSource
    calls: Executor
    tokens: TokenIssuer | None = None  # node tokens for the contract distributor's agents


class PartitionController:
    """Reconciles one partition toward its plan, one cycle at a time."""

    def __init__(
        self,
        partition: Partition,
        world: Partitioned,
        store: RecordStore,
        fence: Fence,
        policy: Policy,
        config: ControllerConfig,
    ) -> None:
        self.partition = partition
        self.world = world
        self.policy = policy
        self.config = config
        self.pools: dict[PoolId, Pool] = {
            p.id: p for p in world.provider.pools() if partition.accepts(p.flavor)
        }
        self.undiscovered: set[PoolId] = set()  # see `_adopt_undiscovered`
        self._views: dict[PoolId, tuple[MadeOf, PoolView]] = {}  # the last snapshot's
        self.records = Records(partition.name, store, fence)
        self.ledger = PoolLedger(store, config.pool_refresh_s)
        self.sightings = Sightings()
        self.partners = Partners(
            partition.name, self.pools, world.ids, config.list_grace_s, config.node_lost_after_s
        )
        self.acquirer = Acquirer(
            partition.name,
            provider=world.provider,
            nodes=world.nodes,
            records=self.records,
            ledger=self.ledger,
            sightings=self.sightings,
            ids=world.ids,
            clock=world.clock,
            config=config,
            calls=world.calls,
            handed_back=lambda: world.signals.handed_back(partition.name),
        )

    @property
    def signals(self) -> FleetSignals:
        return self.world.signals

    # ------------------------------------------------------------ the cycle

    def cycle(self) -> CycleReport:
        tally = self.acquirer.tally = CycleTally()
        return self._cycle_once(tally)

    def _observe(
        self, now: float, tally: CycleTally
    ) -> tuple[Sequence[ServerView], Mapping[str, NodeView], Demand] | str:
        """The cloud's listing, the scheduler's nodes and the demand; or why not."""
        name, w = self.partition.name, self.world
        try:
            servers: Sequence[ServerView] | None = w.provider.list(name)
            cloud_error = ""
        except ProviderError as e:
            servers, cloud_error = None, str(e)
        tally.lap("observe_cloud")
        try:
            # The scheduler's deadline work first, cloud or no cloud: a reclaim's jobs
            # are requeued and its node taken out in time even while the cloud (or sco's
            # credential for it) is away, for the reclaimer deletes at the deadline.
            w.nodes.tend(name, servers)
            if servers is None:
                raise ProviderError(cloud_error)
            nodes = w.nodes.nodes(name)
            demand = w.demand.demand(name, now)
        except (ProviderError, SchedulerUnavailable) as e:
            log.warning("partition %s: observe failed, not acting: %s", name, e)
            tally.lap("observe_scheduler")
            return f"observe failed: {e}"
        tally.lap("observe_scheduler")
        return servers, nodes, demand

    def _cycle_once(self, tally: CycleTally) -> CycleReport:
        now = self.world.clock.now()
        seen = self._observe(now, tally)
        if isinstance(seen, str):
            return self._degraded(now, tally, seen)
        servers, nodes, demand = seen
        self.sightings.keep_notes(servers, nodes, self.records.live())
        self.records.load()
        answered = self.acquirer.answers()  # of calls sent by earlier cycles
        synced = answered + self._sync(servers, nodes, now, tally)
        if self.records.stale:
            # A write lost its race: what this cycle knew is stale. Read again and look
            # once more; a second loss waits for the next cycle, and nothing is planned
            # from records that are not there.
            synced = self._sync(servers, nodes, now, tally)
            if self.records.stale:
                return self._degraded(now, tally, "records moved: reloading")
        tally.lap("sync")
        signals = self.signals
        signals.refresh(now)
        handback = signals.intent(self.partition.name) == HANDBACK
        tally.lap("signals")
        drained, busy, pinned, untold = _node_sets(self.records.live(), nodes)
        self._adopt_undiscovered()
        snapshot = self._snapshot(now, demand, handback, busy)
        if handback:
            decision = Decision({}, {}, ("handback: the operator asked for everything back",))
        else:
            decision = self.policy.decide(snapshot)
        tally.lap("plan")
        plan = self._publish(decision, now, snapshot.demand)
        tally.lap("publish")
        removal = Reason.HANDBACK if handback else Reason.OVER_TARGET
        if handback:
            pinned = frozenset()  # the operator's order outranks what the pods asked
        targets = plan.targets()
        actions = diff(
            snapshot, targets, self.config.act, drained, removal, busy, pinned, untold,
            decision.batches,
        )  # fmt: skip
        acq = self.acquirer
        acq.backoff = backoff.no_room(acq.backoff, targets, snapshot, now)
        # Replacements are owed only while the plan is short of what is live.
        short = sum(targets.values()) - sum(1 for i in self.records.live() if i.is_live)
        acq.owed = min(acq.owed, max(0, short))
        tally.lap("plan")
        transitions = acq.act(actions, snapshot, plan, now)
        acq.sweep(now)
        if self.world.tokens is not None:
            missing = tokenless(servers, self.records.held().values())
            self.world.tokens.issue(self.partition.name, now, self.records.fence.token, missing)
        tally.lap("act")
        return self._full_report(
            now, synced + transitions, actions, decision, snapshot, plan, demand, tally, handback
        )

    def _sync(
        self,
        servers: Sequence[ServerView],
        nodes: Mapping[str, NodeView],
        now: float,
        tally: CycleTally,
    ) -> int:
        """Apply what was observed (`sco.engine.sync`), commit it, count its reclaims
        and adapt the pools' batches; returns the transitions recorded."""
        records = self.records
        out = sync(records.load(), servers, nodes, now, self.sightings, self.partners)
        tally.delays.extend(out.delays)
        observed = out.seen_requests & records.open_requests
        records.open_requests -= observed
        settled = observed | {ch.after.request_id for ch in out.unanswered}
        n = records.commit(out.changes, dict.fromkeys(settled, 0))
        if n:
            self._note_reclaims(out.changes, tally)
        acq = self.acquirer
        adapted = backoff.adapt(
            acq.backoff,
            out.refusals,
            out.acceptances,
            self.config.act.max_batch,
            self.world.clock.now(),
        )
        acq.backoff = adapted.backoff
        for pool, refused, batch in adapted.halved:
            log.info(
                "partition %s: %d refused in %s (no valid host); batches of %d there now",
                self.partition.name, refused, pool, batch,
            )  # fmt: skip
        return n

    def _note_reclaims(self, changes: Sequence[Change], tally: CycleTally) -> None:
        """Reclaims just recorded: the shared signals count them at once, the metrics
        by pool and kind, and each spot one is owed a replacement."""
        for ch, kind in reclaims(changes):
            tally.reclaims[(ch.after.pool, kind)] += 1
            if ch.after.is_spot:
                self.signals.note_reclaim(ch.after.pool, ch.after.id, ch.at)
                if (
                    ch.before is not None and ch.before.state in LIVE
                ):  # capacity it was: a replacement is owed
                    self.acquirer.owed += 1

    def _adopt_undiscovered(self) -> None:
        """Pools the partition holds servers in that discovery did not list when this
        controller was made (an aggregate taken out of it, or a discovery that missed
        one), read from fleet state: they keep what they hold and get nothing new.
        Unknown, their servers were surplus to every plan and replaced at once, and
        the partition went over `max_units` until the drains ended."""
        missing = {i.pool for i in self.records.live()} - self.pools.keys()
        if not missing:
            return
        for pool in self.records.store.pools():
            if pool.id in missing and self.partition.accepts(pool.flavor):
                self.pools[pool.id] = pool
                self.undiscovered.add(pool.id)
                log.warning(
                    "partition %s: pool %s holds its servers but discovery does not list "
                    "it: keeping them there, creating nothing new there",
                    self.partition.name, pool.id,
                )  # fmt: skip

    def _snapshot(
        self, now: float, demand: Demand, handback: bool, busy: frozenset[str]
    ) -> PartitionSnapshot:
        ids = list(self.pools)
        provider = self.world.provider
        headroom = provider.headroom(ids)
        prices = provider.prices(ids)
        return snapshot_of(
            self.partition,
            self.pools,
            now,
            demand,
            headroom=headroom,
            prices=prices,
            records=self.ledger.read(now),
            signals=self.signals,
            refused_at=self.acquirer.backoff.refused_at,
            instances=self.records.live(),
            plan=self.records.plan,
            measured_cold_start_n=self.config.measured_cold_start_n,
            handback=handback,
            busy=busy,
            undiscovered=frozenset(self.undiscovered),
            seen=self._views,
        )

    def _publish(self, decision: Decision, now: float, demand: Demand) -> Plan:
        current = self.records.plan
        plan = next_plan(self.partition.name, current, decision, demand, now)
        if plan is None:
            assert current is not None
            return current
        published = self.records.publish(plan)
        if published is plan:
            log.info(
                "partition %s: plan generation %d spot=%s guaranteed=%s %s",
                self.partition.name,
                plan.generation,
                {p: n for p, n in plan.spot.items() if n},
                {p: n for p, n in plan.guaranteed.items() if n},
                "; ".join(plan.notes),
            )
        return published

    # ------------------------------------------------------------ reports

    def _full_report(
        self,
        now: float,
        transitions: int,
        actions: Actions,
        decision: Decision,
        snapshot: PartitionSnapshot,
        plan: Plan,
        demand: Demand,
        tally: CycleTally,
        handback: bool,
    ) -> CycleReport:
        live = self.records.live()
        pools = snapshot.pools
        placement = placement_of(live, snapshot.demand.target_units, plan.targets())
        ready_units, cost_per_h = 0, 0.0
        for i in live:  # one pass: a partition may hold tens of thousands
            if i.state is State.READY:
                ready_units += i.units
            if i.state in LIVE and i.pool in pools:
                cost_per_h += pools[i.pool].price
        tally.lap("publish")
        return CycleReport(
            partition=self.partition.name,
            at=now,
            plan_generation=plan.generation,
            transitions=transitions,
            created=tally.created,
            drained=len(actions.drains),
            deleted=len(actions.deletes),
            notes=decision.notes,
            placement=placement,
            ready_delays_s=tuple(tally.delays),
            acted=dict(tally.acted),
            reclaims=dict(tally.reclaims),
            replaced=dict(tally.replaced),
            excluded=tuple(p for p, v in pools.items() if v.excluded or v.degraded),
            handback=handback,
            held=len(live),
            unfit_work=demand.unfit_work,
            floor_units=snapshot.demand.floor_units,
            target_units=snapshot.demand.target_units,
            ready_units=ready_units,
            instances=by_class_and_state(live),
            scored_at=self.signals.scored_at,
            cost_per_h=cost_per_h,
            took_s=tally.took_s,
            phases_s=dict(tally.phases),
        )

    def _degraded(self, now: float, tally: CycleTally, why: str) -> CycleReport:
        """The report of a cycle that could not act: why, and nothing done."""
        plan = self.records.plan
        tally.lap("publish")
        return CycleReport(
            partition=self.partition.name,
            at=now,
            plan_generation=plan.generation if plan else 0,
            transitions=0,
            created=0,
            drained=0,
            deleted=0,
            degraded=why,
            took_s=tally.took_s,
            phases_s=dict(tally.phases),
        )


def _node_sets(
    live: Sequence[Instance], nodes: Mapping[str, NodeView]
) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """Draining instances whose nodes have left, instances whose nodes run work, those
    whose nodes run work only a reclaim may disrupt, and draining ones whose scheduler
    does not hold the order to leave (or its reclaim deadline)."""
    busy_servers = {sid for sid, v in nodes.items() if v.busy}
    pinned_servers = {sid for sid, v in nodes.items() if v.pinned}
    drained: list[str] = []
    busy: list[str] = []
    pinned: list[str] = []
    untold: list[str] = []
    for i in live:  # one pass: a partition may hold tens of thousands
        sid = i.server_id
        if sid in busy_servers:
            busy.append(i.id)
        if sid in pinned_servers:
            pinned.append(i.id)
        if i.state is State.DRAINING:
            if sid and nodes.get(sid, GONE).drained:
                drained.append(i.id)
            elif _untold(i, nodes.get(sid or "")):
                untold.append(i.id)
    return frozenset(drained), frozenset(busy), frozenset(pinned), frozenset(untold)


def _untold(inst: Instance, node: NodeView | None) -> bool:
    """Whether a draining instance's node, which its scheduler knows, lacks the order to
    leave, or holds a later deadline than the reclaim's (planes that cannot tell say
    None, and are not told again)."""
    if node is None or node.leaving is None:
        return False
    if not node.leaving:
        return True
    deadline = inst.notice_deadline
    return deadline is not None and (node.reclaim_by is None or node.reclaim_by > deadline + 1.0)
