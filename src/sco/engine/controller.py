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
from concurrent.futures import Executor
from dataclasses import dataclass, field

from sco.decide.acquirer import Actions, Reason, diff
from sco.decide.policies import Decision, Policy
from sco.domain.demand import Partition
from sco.domain.instances import Instance
from sco.domain.lifecycle import LIVE, State
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.engine.act import Act
from sco.engine.calls import INLINE, Outbound
from sco.engine.clock import IdSource
from sco.engine.partition_state import GONE, ControllerConfig, ControllerStore, CycleTally
from sco.engine.planning import Planning
from sco.engine.signals import FleetSignals
from sco.engine.sync import Sync
from sco.engine.tokens import TokenIssuer
from sco.ports import (
    Clock,
    DemandSource,
    NodeView,
    PoolRecord,
    Provider,
    ProviderError,
    SchedulerCluster,
    SchedulerUnavailable,
    ServerView,
)

log = logging.getLogger(__name__)

# ControllerConfig lives with the state it configures, and is named here too.
__all__ = [
    "HANDBACK",
    "PHASES",
    "ControllerConfig",
    "CycleReport",
    "PartitionController",
    "Placement",
    "placement_of",
]


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


class PartitionController(Sync, Planning, Act):
    """Reconciles one partition toward its plan, one cycle at a time."""

    def __init__(
        self,
        partition: Partition,
        *,
        provider: Provider,
        nodes: SchedulerCluster,
        store: ControllerStore,
        demand: DemandSource,
        policy: Policy,
        clock: Clock,
        ids: IdSource,
        signals: FleetSignals | None = None,
        config: ControllerConfig | None = None,
        tokens: TokenIssuer | None = None,
        calls: Executor = INLINE,
    ) -> None:
        """`signals` are shared by the controllers of one process (default: this
        controller's own reader of the store's signals); `calls` runs the creates and
        deletes it sends (default: at once, on the cycle's thread; see sco.engine.calls)."""
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
        self._cycle = CycleTally()
        self._outbound = Outbound(calls)

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
        self._cycle = CycleTally()
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
        self._load()
        answered = self._outbound.answers()  # of calls sent by earlier cycles
        synced = answered + self._sync(self._load(), servers, nodes, now)
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
        transitions = self._act(actions, snapshot, plan, now)
        self._sweep(now)
        if self.tokens is not None:
            self.tokens.issue(self.partition.name, now)
        self._cycle.lap("act")
        report = self._report(
            now, synced + transitions, actions, self._cycle.created, notes=decision.notes
        )
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
            instances=_by_class_and_state(live),
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


def _node_sets(
    live: Sequence[Instance], nodes: Mapping[str, NodeView]
) -> tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]:
    """Draining instances whose nodes have left, instances whose nodes run work, those
    whose nodes run work only a reclaim may disrupt, and draining ones whose scheduler
    does not hold the order to leave (or its reclaim deadline)."""
    drained = frozenset(
        i.id
        for i in live
        if i.state is State.DRAINING and i.server_id and nodes.get(i.server_id, GONE).drained
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


HANDBACK = "handback"


def _by_class_and_state(live: Sequence[Instance]) -> dict[tuple[str, str], int]:
    """Live instances by (class, state) names; counted by the enums themselves, which
    thousands of instances each cycle make cheaper than by their names."""
    counted = Counter((i.capacity_class, i.state) for i in live)
    return {(c.value, st.value): n for (c, st), n in counted.items()}
