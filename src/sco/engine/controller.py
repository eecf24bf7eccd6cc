"""One controller per partition: observe, sync, plan, arbitrate, act, publish.

Decisions are the pure functions of `sco.decide`; this module does the I/O
around them. It keeps the partition's records in memory (it is their only
writer) and writes every change through the store's compare-and-swap; on a
conflict it drops its cache and reloads on the next cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sco.decide.acquirer import ActConfig, Actions, Create, Reason, diff
from sco.decide.policies import Decision, Policy
from sco.domain.demand import Demand, Partition
from sco.domain.instances import Change, Instance, created, step
from sco.domain.lifecycle import HAS_SERVER, LIVE, State, Trigger
from sco.domain.plans import Plan
from sco.domain.pools import CapacityClass, Pool, PoolId
from sco.domain.signals import ExclusionState, PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.engine.clock import IdSource
from sco.engine.signals import FleetSignals
from sco.engine.tokens import TokenIssuer
from sco.ports import (
    Clock,
    DemandSource,
    FencedOut,
    FleetStore,
    InsufficientCapacity,
    NewRequest,
    NodeView,
    PermanentProviderError,
    PoolRecord,
    Provider,
    ProviderError,
    QuotaExceeded,
    Reservation,
    RetryableProviderError,
    SchedulerCluster,
    SchedulerUnavailable,
    ServerStatus,
    ServerView,
    StateConflict,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    act: ActConfig = field(default_factory=ActConfig)
    reservation_ttl_s: float = 600.0  # a reservation not seen as servers by then is swept
    list_grace_s: float = 60.0  # a new server may take this long to show in listings
    sweep_every_s: float = 600.0  # how often stale reservations are swept
    pool_refresh_s: float = 600.0  # planning may use pool reservation counts this old;
    # a create always re-reads them before it reserves
    measured_cold_start_n: int = 5  # readies in history before their median is the cold start
    # A ready node its scheduler has not listed as up for this long (a slurmctld that
    # lost its registration in a crash, a kubelet gone) is capacity no work reaches:
    # it fails, and its server is deleted and replaced.
    node_lost_after_s: float = 300.0


# Where a cycle's wall time goes: listing the cloud, the scheduler's deadline work and
# listing (with the demand), reconciling records with what was seen, reading the fleet's
# signals, planning (the policy and the diff), acting (creates, drains, deletes and their
# records), publishing (the plan generation and the report).
PHASES = ("observe_cloud", "observe_scheduler", "sync", "signals", "plan", "act", "publish")


@dataclass(frozen=True, slots=True)
class CycleReport:
    partition: str
    at: float
    plan_generation: int
    transitions: int
    created: int
    drained: int
    deleted: int
    degraded: str = ""
    notes: tuple[str, ...] = ()
    placement: Placement | None = None  # None when the cycle could not observe
    ready_delays_s: tuple[float, ...] = ()  # request to ready, of instances ready this cycle
    acted: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (action, reason): n
    reclaims: Mapping[tuple[PoolId, str], int] = field(default_factory=dict)  # (pool, kind): n
    replaced: Mapping[PoolId, int] = field(default_factory=dict)  # replacements created
    excluded: tuple[PoolId, ...] = ()  # pools this cycle planned as excluded or degraded
    handback: bool = False  # the partition is being handed back
    held: int = 0  # live instances after the cycle
    unfit_work: int = 0  # jobs or pods no node of the partition could run (not counted)
    floor_units: int = 0
    target_units: int = 0
    ready_units: int = 0  # of any class, ready in their scheduler
    instances: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (class, state): n
    cost_per_h: float = 0.0  # what the live instances cost, at the pools' current prices
    scored_at: float = 0.0  # when the pool scores in use were computed (0: none)
    took_s: float = 0.0  # how long the cycle took (wall time, for metrics)
    phases_s: Mapping[str, float] = field(default_factory=dict)  # of took_s, by PHASES


@dataclass(frozen=True, slots=True)
class Placement:
    """How demand and plan are met, in units: `placed` ready toward the target,
    `unplaced` target not yet ready, `mismatch` live units the plan does not want
    where they are (more in a pool than its target)."""

    placed: int
    unplaced: int
    mismatch: int


def placement_of(
    instances: Sequence[Instance], target: int, plan: Mapping[PoolId, int]
) -> Placement:
    ready = 0
    held: Counter[PoolId] = Counter()
    units: dict[PoolId, int] = {}
    for i in instances:
        state = i.state
        if state in LIVE:
            held[i.pool] += 1
            units[i.pool] = i.units
            if state is State.READY:
                ready += i.units
    mismatch = sum(max(0, n - plan.get(pool, 0)) * units[pool] for pool, n in held.items())
    placed = min(ready, target)
    return Placement(placed=placed, unplaced=max(0, target - ready), mismatch=mismatch)


class PartitionController:
    """Reconciles one partition toward its plan, one cycle at a time."""

    def __init__(
        self,
        partition: Partition,
        *,
        provider: Provider,
        nodes: SchedulerCluster,
        store: FleetStore,
        demand: DemandSource,
        policy: Policy,
        clock: Clock,
        ids: IdSource,
        signals: FleetSignals | None = None,
        config: ControllerConfig | None = None,
        tokens: TokenIssuer | None = None,
    ) -> None:
        """`signals` are shared by the controllers of one process (default: this
        controller's own reader of the store's signals)."""
        self.partition = partition
        self.provider = provider
        self.nodes = nodes
        self.store = store
        self.demand = demand
        self.policy = policy
        self.clock = clock
        self.ids = ids
        self.signals = signals or FleetSignals(store, provider.pools())
        self.config = config or ControllerConfig()
        self.tokens = tokens  # node tokens for the contract distributor's agents
        self._pools: dict[PoolId, Pool] = {
            p.id: p for p in provider.pools() if partition.accepts(p.flavor)
        }
        self._records: dict[str, Instance] | None = None
        self._plan: Plan | None = None
        self._plan_loaded = False
        self._open_requests: set[str] = set()
        self._last_sweep = float("-inf")
        self._pool_records: Mapping[PoolId, PoolRecord] = {}
        self._pool_records_at = float("-inf")
        self._node_notes: dict[str, str] = {}  # server id -> what its leaving cuts short
        self._owed = 0  # spot reclaimed and not yet replaced: creates count as replacements
        self._seen: set[str] = set()  # server ids some listing showed
        self._quiet: dict[str, tuple[Instance, ServerView, NodeView]] = {}
        self._unjoined: dict[str, float] = {}  # server id -> first cycle its READY node was not
        self._batch: dict[PoolId, int] = {}  # a pool's batch after refusals (default: max)
        self._refused_at: dict[PoolId, float] = {}  # the last create a pool refused
        self._refusals: Counter[PoolId] = Counter()
        self._acceptances: Counter[PoolId] = Counter()
        self._cycle = _CycleTally()

    # ------------------------------------------------------------ the cycle

    def cycle(self) -> CycleReport:
        started = time.perf_counter()
        report = self._cycle_once()
        self._cycle.lap("publish")
        return dataclasses.replace(
            report, took_s=time.perf_counter() - started, phases_s=dict(self._cycle.phases)
        )

    def _cycle_once(self) -> CycleReport:
        now = self.clock.now()
        self._cycle = _CycleTally()
        name = self.partition.name
        try:
            servers: Sequence[ServerView] | None = self.provider.list(name)
            cloud_error = ""
        except ProviderError as e:
            servers, cloud_error = None, str(e)
        self._cycle.lap("observe_cloud")
        try:
            # The scheduler's deadline work first, cloud or no cloud: a reclaim's jobs
            # are requeued and its node taken out in time even while the cloud (or sco's
            # credential for it) is away, for the reclaimer deletes at the deadline.
            self.nodes.tend(name, servers)
            if servers is None:
                raise ProviderError(cloud_error)
            nodes = self.nodes.nodes(name)
            demand = self.demand.demand(name, now)
        except (ProviderError, SchedulerUnavailable) as e:
            log.warning("partition %s: observe failed, not acting: %s", name, e)
            self._cycle.lap("observe_scheduler")
            return self._report(now, 0, Actions(), 0, degraded=f"observe failed: {e}")
        self._cycle.lap("observe_scheduler")
        self._keep_notes(servers, nodes)
        synced = self._sync(self._load(), servers, nodes, now)
        if self._records is None:
            # A write lost its race: what this cycle knew is stale. Read again and look
            # once more; a second loss waits for the next cycle, and nothing is planned
            # from records that are not there.
            synced = self._sync(self._load(), servers, nodes, now)
            if self._records is None:
                return self._report(now, 0, Actions(), 0, degraded="records moved: reloading")
        self._cycle.lap("sync")
        self.signals.refresh(now)
        handback = self.signals.intent(self.partition.name) == HANDBACK
        self._cycle.lap("signals")
        drained, busy, pinned, untold = _node_sets(self._live(), nodes)
        snapshot = self._snapshot(now, demand, handback, busy)
        if handback:
            decision = Decision({}, {}, ("handback: the operator asked for everything back",))
        else:
            decision = self.policy.decide(snapshot)
        self._cycle.lap("plan")
        plan = self._publish_plan(decision, now, snapshot.demand)
        self._cycle.lap("publish")
        removal = Reason.HANDBACK if handback else Reason.OVER_TARGET
        if handback:
            pinned = frozenset()  # the operator's order outranks what the pods asked
        actions = diff(
            snapshot, plan.targets(), self.config.act, drained, removal, busy, pinned, untold
        )
        self._note_no_room(plan.targets(), snapshot, now)
        # Replacements are owed only while the plan is short of what is live.
        short = sum(plan.targets().values()) - sum(1 for i in self._live() if i.is_live)
        self._owed = min(self._owed, max(0, short))
        self._cycle.lap("plan")
        transitions, created_n = self._act(actions, snapshot, plan, now)
        self._sweep(now)
        if self.tokens is not None:
            self.tokens.issue(self.partition.name, now)
        self._cycle.lap("act")
        report = self._report(now, synced + transitions, actions, created_n, notes=decision.notes)
        live = self._live()
        return dataclasses.replace(
            report,
            placement=placement_of(live, snapshot.demand.target_units, plan.targets()),
            ready_delays_s=tuple(self._cycle.delays),
            acted=dict(self._cycle.acted),
            reclaims=dict(self._cycle.reclaims),
            replaced=dict(self._cycle.replaced),
            excluded=tuple(p for p, v in snapshot.pools.items() if v.excluded or v.degraded),
            handback=handback,
            held=len(live),
            unfit_work=demand.unfit_work,
            floor_units=snapshot.demand.floor_units,
            target_units=snapshot.demand.target_units,
            ready_units=sum(i.units for i in live if i.state is State.READY),
            instances=Counter((i.capacity_class.value, i.state.value) for i in live),
            scored_at=self.signals.scored_at,
            cost_per_h=sum(
                snapshot.pools[i.pool].price for i in live if i.is_live and i.pool in snapshot.pools
            ),
        )

    def _report(
        self,
        now: float,
        transitions: int,
        actions: Actions,
        created_n: int,
        degraded: str = "",
        notes: tuple[str, ...] = (),
    ) -> CycleReport:
        return CycleReport(
            partition=self.partition.name,
            at=now,
            plan_generation=self._plan.generation if self._plan else 0,
            transitions=transitions,
            created=created_n,
            drained=len(actions.drains),
            deleted=len(actions.deletes),
            degraded=degraded,
            notes=notes,
        )

    # ------------------------------------------------------------ state cache

    def _load(self) -> dict[str, Instance]:
        if self._records is None:
            self._records = {i.id: i for i in self.store.instances(self.partition.name)}
            self._open_requests = {
                r.request_id
                for r in self.store.reservations()
                if r.partition == self.partition.name
            }
        if not self._plan_loaded:
            self._plan = self.store.latest_plan(self.partition.name)
            self._plan_loaded = True
        return self._records

    def _live(self) -> list[Instance]:
        return list((self._records or {}).values())

    def _commit(self, changes: Sequence[Change], settle: Mapping[str, int] | None = None) -> int:
        """Persist changes (and settle reservations) and update the cache; on conflict
        drop the cache."""
        if not changes and not settle:
            return 0
        try:
            self.store.record(changes, settle)
        except StateConflict as e:
            self._records = None
            if isinstance(e, FencedOut):
                raise  # another leader writes now: this controller stops (its runner says so)
            log.warning("partition %s: %s; reloading", self.partition.name, e)
            return 0
        assert self._records is not None
        for ch in changes:
            if ch.after.state is State.GONE:
                self._records.pop(ch.after.id, None)
            else:
                self._records[ch.after.id] = ch.after
        if log.isEnabledFor(logging.INFO):
            for ch in changes:
                _log_transition(ch)
        return len(changes)

    # ------------------------------------------------------------ sync

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
            looked = (inst, view, nodes.get(view.server_id, _GONE))
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
        if _notice_is_news(inst, view.notice_deadline):
            go(
                Trigger.RECLAIM_NOTICE,
                f"reclaim notice: leave by {view.notice_deadline:.0f}",
                notice_deadline=view.notice_deadline,
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

    # ------------------------------------------------------------ plan

    def _snapshot(
        self,
        now: float,
        demand: Demand,
        handback: bool = False,
        busy: frozenset[str] = frozenset(),
    ) -> PartitionSnapshot:
        """What the policy sees; a partition handed back wants nothing (floor 0 too)."""
        ids = list(self._pools)
        headroom = self.provider.headroom(ids)
        prices = self.provider.prices(ids)
        records = self._records_of_pools(now)
        views = {}
        signals = self.signals
        for p, pool in self._pools.items():
            state = signals.state(p, now)
            score = signals.score(p)
            views[p] = PoolView(
                pool=pool,
                headroom=headroom.get(p, 0),
                reserved=records[p].reserved if p in records else 0,
                price_per_h=prices.get(p),
                recent_reclaims=signals.recent_reclaims(p, now),
                last_reclaim_at=signals.last_reclaim(p),
                last_refusal_at=self._refused_at.get(p),
                up_since=signals.up_since(p),
                notice_s=pool.notice_s,
                cold_start_s=self._cold_start(pool, score),
                score=score,
                version=records[p].version if p in records else 0,
                excluded=state is ExclusionState.EXCLUDED,
                degraded=state is ExclusionState.DEGRADED,
            )
        if handback:
            demand = Demand(0, 0, demand.max_units, demand.guaranteed_budget_units)
        return PartitionSnapshot(
            partition=self.partition,
            now=now,
            demand=demand,
            pools=views,
            instances=tuple(self._live()),
            plan=self._plan,
            busy=busy,
        )

    def _cold_start(self, pool: Pool, score: PoolScore | None) -> float | None:
        """What the region file says, else what history measured (enough readies)."""
        if pool.cold_start_s is not None:
            return pool.cold_start_s
        measured = score is not None and score.ready_n >= self.config.measured_cold_start_n
        return score.ready_p50_s if measured and score is not None else None

    def _records_of_pools(self, now: float, fresh: bool = False) -> Mapping[PoolId, PoolRecord]:
        if fresh or now - self._pool_records_at >= self.config.pool_refresh_s:
            self._pool_records = self.store.pool_records()
            self._pool_records_at = now
        return self._pool_records

    def _publish_plan(self, decision: Decision, now: float, demand: Demand) -> Plan:
        current = self._plan
        if current is not None and current.same_decision(
            decision.spot, decision.guaranteed, decision.notes, decision.pools
        ):
            return current
        plan = Plan(
            partition=self.partition.name,
            generation=(current.generation if current else 0) + 1,
            created_at=now,
            spot=dict(decision.spot),
            guaranteed=dict(decision.guaranteed),
            notes=decision.notes,
            pools=dict(decision.pools),
            # What the partition wanted when it was planned: for whoever reads the plan.
            terms={
                **decision.terms,
                "target_units": float(demand.target_units),
                "floor_units": float(demand.floor_units),
            },
        )
        try:
            self.store.save_plan(plan)
        except FencedOut:
            self._plan_loaded = False
            raise
        except StateConflict as e:
            log.warning("partition %s: %s; reloading plan", self.partition.name, e)
            self._plan_loaded = False
            return current or plan
        log.info(
            "partition %s: plan generation %d spot=%s guaranteed=%s %s",
            self.partition.name,
            plan.generation,
            {p: n for p, n in plan.spot.items() if n},
            {p: n for p, n in plan.guaranteed.items() if n},
            "; ".join(plan.notes),
        )
        self._plan = plan
        return plan

    # ------------------------------------------------------------ act

    def _act(
        self, actions: Actions, snapshot: PartitionSnapshot, plan: Plan, now: float
    ) -> tuple[int, int]:
        records = self._records or {}
        changes: list[Change] = []
        acted = self._cycle.acted
        for e in actions.expirations:
            inst = records[e.instance_id]
            changes.append(step(inst, Trigger.EXPIRED, now, e.detail or e.reason, code=e.reason))
            acted[("expire", e.reason)] += 1
        for c in actions.closes:
            inst = records[c.instance_id]
            why = self._noted(inst, c.detail or c.reason)
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
            why = d.detail or f"{d.reason}: leave by {d.drain_by:.0f}"
            changes.append(
                step(inst, Trigger.DRAIN_REQUESTED, now, why, code=d.reason, drain_by=d.drain_by)
            )
        deletes = [(records[x.instance_id], x) for x in actions.deletes]
        for i, x in deletes:
            changes.append(
                step(i, x.trigger, now, self._noted(i, x.detail or x.reason), code=x.reason)
            )
            acted[("delete", x.reason)] += 1
        # The intent is recorded first, then the scheduler and the cloud are told: a
        # write refused (a conflict, another leader) leaves no node drained that sco
        # still counts as ready, and none deleted; one told late is told again (`untold`).
        n = self._commit(changes)
        if changes and not n:
            return 0, 0  # lost a race: the next cycle plans from what is there
        self._tell_drains(tell)
        self._delete([i.server_id for i, _ in deletes if i.server_id])
        created_n = 0
        for create in actions.creates:
            k, recorded = self._create(create, snapshot, plan, now)
            created_n += k
            n += recorded
        return n, created_n

    def _tell_drains(self, tell: Sequence[tuple[str, float, str]]) -> None:
        """Tell the scheduler of each drain just recorded; one it cannot take now is told
        again on a later cycle, as its node does not hold the order. A reclaim's work is
        then tended at once: a notice shorter than a cycle would otherwise reach its
        deadline before the next cycle requeues or evicts anything."""
        name = self.partition.name
        try:
            for server_id, drain_by, reason in tell:
                self.nodes.drain(name, server_id, drain_by, reason)
            if any(reason == Reason.RECLAIM_NOTICE for _, _, reason in tell):
                self.nodes.tend(name, None)
        except SchedulerUnavailable as e:
            log.warning("partition %s: drains not all sent, will resend: %s", name, e)

    def _keep_notes(self, servers: Sequence[ServerView], nodes: Mapping[str, NodeView]) -> None:
        """Remember what the scheduler said of each node until its server's end is
        recorded: a reclaimed server is often gone from the listing by then."""
        notes = self._node_notes
        notes.update({s: v.note for s, v in nodes.items() if v.note})
        keep = {i.server_id for i in self._live() if i.server_id} | {v.server_id for v in servers}
        for s in [s for s in notes if s not in keep]:
            del notes[s]

    def _noted(self, inst: Instance, why: str) -> str:
        """`why` with what the scheduler said leaving cuts short (jobs it could not
        requeue), so that the event of the node's end reports it."""
        note = self._node_notes.get(inst.server_id or "")
        return f"{why}; {note}" if note else why

    def _delete(self, server_ids: list[str]) -> None:
        """Delete servers whose TERMINATING records are already written: the intent
        is recorded first, so a controller whose lease was taken over (its write
        refused) deletes nothing, and a delete that fails is sent again when the
        record's timeout passes."""
        if not server_ids:
            return
        try:
            self.provider.delete(server_ids)
        except ProviderError as e:
            log.warning("partition %s: delete failed, will resend: %s", self.partition.name, e)

    def _create(
        self, create: Create, snapshot: PartitionSnapshot, plan: Plan, now: float
    ) -> tuple[int, int]:
        """Reserve, record REQUESTED, create, record the outcome. Returns (created, changes).
        Nothing once a write of this cycle lost its race: what it planned from is stale."""
        if self._records is None:
            return 0, 0
        # The request's own time, not the cycle's: calls before it (a slow cloud) may
        # have taken a while, and the listing grace of its servers counts from here.
        now = self.clock.now()
        view = snapshot.pools[create.pool]
        fresh = self._records_of_pools(now, fresh=True).get(create.pool)
        if fresh is None:
            return 0, 0
        cap = self._batch.get(create.pool, create.count)
        count = min(create.count, cap, view.headroom - fresh.reserved)
        if count <= 0:
            return 0, 0
        request_id = self.ids.new("req")
        pool = view.pool
        replacing = min(self._owed, count)
        codes = [Reason.REPLACE_RECLAIMED] * replacing + [create.reason] * (count - replacing)
        instances = tuple(
            Instance(
                id=self.ids.new("inst"),
                partition=self.partition.name,
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
            request_id,
            pool.id,
            self.partition.name,
            count,
            now,
            now + self.config.reservation_ttl_s,
        )
        try:
            self.store.reserve(NewRequest(reservation, instances, fresh.version))
        except FencedOut:
            raise
        except StateConflict as e:
            log.info("partition %s: reservation lost a race: %s", self.partition.name, e)
            return 0, 0
        assert self._records is not None
        for i in instances:
            self._records[i.id] = i
        if log.isEnabledFor(logging.INFO):
            log.info(
                "partition %s: requesting %d in %s [%s] (request %s, plan %d)",
                self.partition.name,
                count,
                pool.id,
                ", ".join(sorted(set(codes))),
                request_id,
                plan.generation,
            )
        self._open_requests.add(request_id)
        try:
            result = self.provider.create(
                pool.id, count, request_id, self.partition.name, plan.generation
            )
        except RetryableProviderError as e:
            # The outcome is unknown: records stay REQUESTED until listed or expired.
            log.warning("partition %s: create %s unknown: %s", self.partition.name, request_id, e)
            return 0, len(instances)
        except (InsufficientCapacity, QuotaExceeded, PermanentProviderError) as e:
            self._refused_at[pool.id] = now
            self._refused(instances, request_id, str(e), now)
            return 0, len(instances)
        now = self.clock.now()  # the answer's time: what it accepted was made by then
        if result.pending:
            # Taken: the records stay REQUESTED until their servers are listed.
            unsent = instances[result.pending :]
            refused = [
                step(i, Trigger.CREATE_FAILED, now, result.shortfall_reason or "not sent")
                for i in unsent
            ]
            recorded = self._commit(refused, {request_id: result.pending} if refused else None)
            self._count_created(codes[: result.pending], replacing, pool.id)
            return result.pending, len(instances) + recorded
        accepted = [
            step(inst, Trigger.CREATE_ACCEPTED, now, "create accepted", server_id=sid)
            for inst, sid in zip(instances, result.server_ids, strict=False)
        ]
        refused = [
            step(inst, Trigger.CREATE_FAILED, now, result.shortfall_reason or "not accepted")
            for inst in instances[len(result.server_ids) :]
        ]
        if not accepted:
            self._open_requests.discard(request_id)
        recorded = self._commit(accepted + refused, {request_id: len(accepted)})
        self._count_created(codes[: len(accepted)], replacing, pool.id)
        return len(accepted), len(instances) + recorded

    def _count_created(self, codes: Sequence[Reason], replacing: int, pool: PoolId) -> None:
        replaced = min(replacing, len(codes))
        self._owed -= replaced
        if replaced:
            self._cycle.replaced[pool] += replaced
        for code in codes:
            self._cycle.acted[("create", str(code))] += 1

    def _refused(
        self, instances: Sequence[Instance], request_id: str, why: str, now: float
    ) -> None:
        log.info("partition %s: create %s refused: %s", self.partition.name, request_id, why)
        self._open_requests.discard(request_id)
        self._commit([step(i, Trigger.CREATE_FAILED, now, why) for i in instances], {request_id: 0})

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < self.config.sweep_every_s:
            return
        self._last_sweep = now
        swept = self.store.sweep_reservations(now)
        if swept:
            log.info("swept %d stale reservations", swept)
            self._open_requests = {
                r.request_id
                for r in self.store.reservations()
                if r.partition == self.partition.name
            }


@dataclass
class _CycleTally:
    """What one cycle did, for its report."""

    delays: list[float] = field(default_factory=list)
    acted: Counter[tuple[str, str]] = field(default_factory=Counter)
    reclaims: Counter[tuple[PoolId, str]] = field(default_factory=Counter)
    replaced: Counter[PoolId] = field(default_factory=Counter)
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds, by PHASES
    _lap_at: float = field(default_factory=time.perf_counter)

    def lap(self, phase: str) -> None:
        """Close a phase: the wall time since the last lap counts toward `phase` (a
        phase may come back, as planning does around publishing the plan)."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._lap_at
        self._lap_at = now


def _node_sets(
    live: Sequence[Instance], nodes: Mapping[str, NodeView]
) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """Draining instances whose nodes have left, instances whose nodes run work, those
    whose nodes run work only a reclaim may disrupt, and draining ones whose scheduler
    does not hold the order to leave (or its reclaim deadline)."""
    drained = frozenset(
        i.id
        for i in live
        if i.state is State.DRAINING and i.server_id and nodes.get(i.server_id, _GONE).drained
    )
    busy_servers = {sid for sid, v in nodes.items() if v.busy}
    busy = frozenset(i.id for i in live if busy_servers and i.server_id in busy_servers)
    pinned_servers = {sid for sid, v in nodes.items() if v.pinned}
    pinned = frozenset(i.id for i in live if pinned_servers and i.server_id in pinned_servers)
    untold = frozenset(
        i.id
        for i in live
        if i.state is State.DRAINING
        and i.id not in drained
        and _untold(i, nodes.get(i.server_id or ""))
    )
    return drained, busy, pinned, untold


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


def _log_transition(ch: Change) -> None:
    after = ch.after
    log.info(
        "partition %s: %s %s %s -> %s [%s] %s%s",
        after.partition,
        after.id,
        after.pool,
        ch.before.state if ch.before else "new",
        after.state,
        ch.code or (ch.trigger or "created"),
        ch.reason,
        f" (server {after.server_id})" if after.server_id else "",
    )


def _notice_is_news(inst: Instance, deadline: float | None) -> bool:
    """A reclaim notice the record does not hold yet: the first one (whatever state the
    instance is in, draining included), or one with a sooner deadline: the sooner wins."""
    if deadline is None or inst.state not in _CAN_NOTICE:
        return False
    return inst.notice_deadline is None or deadline < inst.notice_deadline


HANDBACK = "handback"
_GONE = NodeView(joined=False, drained=False)
_CAN_ERROR = frozenset({State.CREATING, State.ACTIVE, State.READY})
_CAN_NOTICE = frozenset({State.CREATING, State.ACTIVE, State.READY, State.NOTICED, State.DRAINING})
_RECLAIMED = frozenset({Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED})
