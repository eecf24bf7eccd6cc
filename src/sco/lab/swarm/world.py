"""The swarm's world: one simulated region, the schedulers of its partitions, and an
installation of sco (two replicas on one fleet state, the signal jobs) with the real
controller, node planes, signal pump, watcher, scorer and lease logic, each replica
made by the one builder (`sco.engine.builder`) as `sco run` makes its own; perhaps a
second installation in the same project.

Fleet state is the in-memory twin by default, or a SQLite database (`state`
"sqlite"): both are held to one conformance suite, and a seed gives the same
result on either. Everything runs on one simulated clock, on one thread, in an
order fixed by the seed: a run can be repeated exactly.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Protocol

from sco.adapters.demandfile.intake import FileDemandSource, PartitionDemand, UnitSeries
from sco.adapters.kubernetes.demand import KubeDemandSpec
from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
from sco.adapters.slurm.nodes import SlurmNodes, SlurmPartition, SlurmView, node_name
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.binpack import Size
from sco.decide.policies import ScoPolicy
from sco.decide.scorer import ScorerConfig
from sco.domain.demand import Partition, SchedulerKind
from sco.domain.pools import Pool, PoolId
from sco.engine import builder
from sco.engine.builder import FleetState, NodeTokens, Ports, Pumping
from sco.engine.clock import CountingIds, ManualClock
from sco.engine.cycle import ControllerConfig
from sco.engine.leases import PairedLeases
from sco.engine.pump import PumpConfig
from sco.engine.replicas import ReplicaConfig, ReplicaRunner
from sco.engine.routing import DemandRouter, NodeRouter
from sco.engine.signals_jobs import HistoryLoader, ScoringJob
from sco.engine.watcher import ExclusionWatcher
from sco.lab.history import WindowedHistory
from sco.lab.region import SimConfig, SimRegion
from sco.lab.swarm.agents import TOKEN_TTL_S, Agents, Courier, LedgerFaults
from sco.lab.swarm.calls import SeededCalls
from sco.lab.swarm.faults import (
    CloudFaults,
    EventsFaults,
    HistoryFaults,
    LeaseFaults,
    NodeFaults,
    Stage,
    StoreFaults,
    faulty,
)
from sco.lab.swarm.ids import RepeatingIds
from sco.lab.swarm.kube import (
    KubeCaller,
    SimKube,
    kube_intake,
    kube_partition,
    kube_plane,
)
from sco.lab.swarm.slurm import SimSlurm, SlurmCaller
from sco.lab.swarm.spec import BLUE, START_S, PartitionPlan, WorldSpec
from sco.lab.traces import RegionSpec, Series, TraceSet
from sco.lab.twins.eventlog import MemoryEventLog
from sco.lab.twins.fleet import MemoryFleetStore
from sco.lab.twins.leases import KubeLeases
from sco.ports import (
    Clock,
    Contracts,
    CreateResult,
    DemandSource,
    FleetAudit,
    FleetStore,
    LeaseStore,
    NodeView,
    SchedulerCluster,
    ServerView,
)

STATES = ("memory", "sqlite")  # what fleet state a world runs on


class SwarmStore(FleetStore, FleetAudit, Protocol):
    """Fleet state as the swarm keeps it: every role, and what its checks audit."""


LEASE_TTL_S = 30.0
STEP_S = 10.0  # the swarm's clock moves this much a step
REQUEUE_LEAD_S = 60.0  # a reclaim's jobs are requeued this long before it (2 cycles)
KUBE_GRACE_S = 60.0  # a reclaim's pods are deleted from this long before it (2 cycles)
CPUS, MEMORY_MB = 4, 8192


class Tenant:
    """One installation's view of the shared region: what it creates carries its name,
    and it lists and sees as nodes only its own (the cloud's rule,
    `sco.domain.installation`)."""

    def __init__(self, region: SimRegion, installation: str) -> None:
        self.region = region
        self.installation = installation

    def pools(self) -> Sequence[Pool]:
        return self.region.pools()

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        return self.region.headroom(pools)

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        return self.region.prices(pools)

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        return self.region.create(
            pool, count, request_id, partition, plan_generation, self.installation
        )

    def delete(self, server_ids: Sequence[str]) -> None:
        self.region.delete(server_ids)

    def list(self, partition: str) -> Sequence[ServerView]:
        return self.region.list(partition, self.installation)

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return self.region.nodes(partition, self.installation)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.region.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.region.drain(partition, server_id, drain_by, reason)


class SkewedClock:
    def __init__(self, base: ManualClock) -> None:
        self.base = base
        self.skew_s = 0.0

    def now(self) -> float:
        return self.base.now() + self.skew_s


@dataclass
class Replica:
    slot: str  # r1, r2: what faults name
    name: str  # this process's name (a restarted one is another)
    installation: str
    runner: ReplicaRunner
    cloud: CloudFaults
    nodes: NodeFaults
    store: StoreFaults
    clock: SkewedClock
    connection: SqlFleetStore | None  # its own connection to the database, if any
    calls: SeededCalls  # its call workers
    next_tend: float = 0.0
    next_cycle: dict[str, float] = field(default_factory=dict)


@cache
def _template() -> Path:
    """A migrated fleet-state file: each world copies it rather than migrating anew."""
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() else None
    folder = Path(tempfile.mkdtemp(prefix="sco-swarm-template-", dir=where))
    path = folder / "state.sqlite"
    SqlFleetStore(sqlite_url(path)).close()
    return path


def fresh_state(path: Path) -> str:
    shutil.copyfile(_template(), path)
    return sqlite_url(path)


def traces_of(spec: WorldSpec) -> TraceSet:
    series = tuple(
        Series(
            p.name,
            tuple(START_S + t for t, _ in p.capacity),
            tuple(n for _, n in p.capacity),
            tick_s=3600.0,
        )
        for p in spec.pools
    )
    region = RegionSpec(
        name="swarm",
        halls=spec.halls,
        hall_of={p.name: p.hall for p in spec.pools},
        pool_size=1,
        spot_price_per_h=1.0,
        guaranteed_price_per_h=3.0,
        guaranteed_quota_per_hall=spec.guaranteed_quota,
    )
    return TraceSet(Path(f"swarm-{spec.seed}"), series, region)


def region_of(spec: WorldSpec) -> SimRegion:
    config = SimConfig(
        api_latency_s=1.0,
        cold_start_s=60.0,
        join_s=10.0,
        drain_s=20.0,
        delete_s=5.0,
        notice_s=spec.notice_s,
        pool_size=1,
        guaranteed_quota_per_hall=spec.guaranteed_quota,
        seed=spec.seed,
    )
    return SimRegion(traces_of(spec), config, start_s=START_S)


def twin_of(plan: PartitionPlan, clock: ManualClock, installation: str) -> SimSlurm | SimKube:
    if plan.kind == "slurm":
        shape = Size(CPUS, MEMORY_MB)
        feature = SlurmPartition(plan.name, ("batch",), shape, installation=installation).feature
        return SimSlurm(f"slurm-{plan.name}", CPUS, MEMORY_MB, clock.now, feature)
    return SimKube(plan.name, clock.now, plan.targets, plan.protected, CPUS)


def node_name_of(twin: SimSlurm | SimKube, server_id: str) -> str:
    return node_name(server_id) if isinstance(twin, SimSlurm) else f"node-{server_id}"


def node_life(twin: SimSlurm | SimKube, sid: str) -> tuple[float | None, float | None]:
    """(since when the server's node was in its scheduler, when it was first told of
    a reclaim), None for a node that never was."""
    name = node_name_of(twin, sid)
    if isinstance(twin, SimSlurm):
        node = twin.nodes_by_name.get(name)
        return (node.registered_at if node else None), twin.told_reclaim_by(name)
    return twin.registered.get(name), twin.told_reclaim_at(name)


def running_on(twin: SimSlurm | SimKube, sid: str) -> list[str]:
    if isinstance(twin, SimSlurm):
        jobs = twin.running_on(node_name_of(twin, sid))
        return [f"job {q.job.job_id}" for q in jobs if q.requeue]
    return [f"pod {p}" for p in twin.running_on(node_name_of(twin, sid))]


class Installation:
    """One sco: fleet state, its partitions' schedulers, replicas and signal jobs."""

    def __init__(
        self,
        name: str,
        spec: WorldSpec,
        plans: Sequence[PartitionPlan],
        region: SimRegion,
        clock: ManualClock,
        stage: Stage,
        folder: Path,
        slots: Sequence[str],
        state: str = "memory",
        shared: Mapping[str, SimSlurm | SimKube] | None = None,
    ) -> None:
        """`shared`: clusters this installation's partitions of those names share with
        another installation's (the same Kubernetes cluster)."""
        if state not in STATES:
            raise ValueError(f"state: one of {', '.join(STATES)}, not {state!r}")
        self.name = name
        self.spec = spec
        self.plans = {p.name: p for p in plans}
        self.region = region
        self.clock = clock
        self.stage = stage
        self.folder = folder
        self.state = state
        self.url: str | None = None
        self.store: SwarmStore
        self.events: SqlEventLog | MemoryEventLog
        self.lease_table: LeaseStore  # the database's (leases kept there, and fencing)
        # What a holder that died without a word leaves in the database's leases.
        self.lapse: Callable[[str], None]
        if state == "sqlite":
            self.url = fresh_state(folder / f"{name}.sqlite")
            sql = SqlFleetStore(self.url, run_migrations=False)
            self.store, self.events, self._close = sql, SqlEventLog(sql.engine), sql.close
            self.contracts: Contracts = sql.contracts
            table = SqlLeases(sql.engine)
            self.lease_table, self.lapse = table, table.lapse
        else:
            memory = MemoryFleetStore(contracts=True)
            self.store, self.events, self._close = memory, MemoryEventLog(memory), memory.close
            self.contracts = memory.contracts
            self.lease_table, self.lapse = memory.leases, memory.leases.lapse
        self.store.upsert_pools(region.pools())
        self.tenant = Tenant(region, name)
        self.twins: dict[str, SimSlurm | SimKube] = {
            p.name: (shared or {}).get(p.name) or twin_of(p, clock, name)
            for p in plans
            if p.kind != "static"
        }
        # The contract distributor, and an agent on each server given a token.
        self.agents = Agents(self.contracts, stage, clock.now)
        self.kube_leases = KubeLeases()
        self._node_servers: dict[str, str] = {}  # Slurm node name -> server id
        self.lease_kind = spec.leases
        pools = list(region.pools())
        # The watcher's and the scorer's own processes reach the log (and the scorer its
        # history) through the seed's faults.
        self.reaching = EventsFaults(self.events, stage.schedule)
        self.watcher = ExclusionWatcher(self.reaching, self.store, pools)
        scorer = ScorerConfig()
        history = HistoryFaults(WindowedHistory(scorer.window_s), stage.schedule)
        self.scorer = ScoringJob(
            HistoryLoader(self.reaching, history),
            self.store,
            {p.id: p for p in pools},
            scorer,
            300.0,
        )
        self.slots = tuple(slots)
        self.replicas: dict[str, Replica] = {}
        self.generation: dict[str, int] = {}
        for slot in slots:
            self.start(slot)

    def relay(self) -> int:
        """The outbox into the event log; returns how many events were new to it."""
        return self.reaching.absorb_outbox()

    def partitions(self) -> list[Partition]:
        return [
            Partition(
                p.name,
                "swarm",
                SchedulerKind.KUBERNETES if p.kind == "kubernetes" else SchedulerKind.SLURM,
            )
            for p in self.plans.values()
        ]

    # ------------------------------------------------------------ a replica

    def start(self, slot: str) -> Replica:
        """A new `sco run` process in `slot`: nothing in memory, its own connection (or,
        on the twin, the one fleet state every process shares)."""
        gen = self.generation[slot] = self.generation.get(slot, 0) + 1
        name = f"{self.name}-{slot}.{gen}"
        connection = None
        table: LeaseStore = self.lease_table
        if self.url is not None:
            connection = SqlFleetStore(self.url, run_migrations=False)
            table = SqlLeases(connection.engine)
        state, store = faulty(connection or self.store, self.stage, slot)
        cloud = CloudFaults(self.tenant, self.stage, slot)
        clock = SkewedClock(self.clock)
        listing = _Listing(cloud)
        # `sco run`'s two workers, each call the region's API latency.
        per_step = int(2 * STEP_S / self.region.config.api_latency_s)
        calls = SeededCalls(random.Random(f"{self.spec.seed}/{name}"), per_step)
        demand, planes = self._schedulers(listing, clock)
        nodes = NodeFaults(NodeRouter(planes, cloud), self.stage, slot)
        if self.lease_kind == "database":
            leases = LeaseFaults(table, self.stage, in_database=True)
        else:
            leases = LeaseFaults(PairedLeases(self.kube_leases, table), self.stage, False)
        ledger = LedgerFaults(
            connection.contracts if connection is not None else self.contracts,
            store, lambda: cloud.partition,
        )  # fmt: skip
        courier = Courier(self.region, self.stage, self.agents)
        ports = Ports(
            provider=cloud,
            nodes=nodes,
            demand=demand,
            state=FleetState.of(state),
            clock=clock,
            ids=RepeatingIds(CountingIds(f"{self.name}-{slot}.{gen}-"), self.stage.schedule, slot),
            leases=leases,
            events=self.events,
            relay=self.relay,
            tokens=NodeTokens(ledger, courier, TOKEN_TTL_S, frozenset(self.plans)),
            calls=calls,
        )
        runner = builder.replica(
            ports,
            ReplicaConfig(name, lease_ttl_s=LEASE_TTL_S, lease_every_s=10.0, act_margin_s=10.0),
            ScoPolicy,
            self.spec.interval_s,
            controller=ControllerConfig(),
            pumping=Pumping(
                PumpConfig(relay_every_s=15.0, ages_every_s=60.0, stamp_every_s=15.0),
                pace=clock.now,
            ),
        )
        replica = Replica(
            slot, name, self.name, runner, cloud, nodes, store, clock, connection, calls
        )
        self.replicas[slot] = replica
        return replica

    def stop(self, slot: str) -> None:
        """The process is gone (killed: nothing handed back)."""
        replica = self.replicas.pop(slot, None)
        if replica is None:
            return
        replica.calls.shutdown(cancel_futures=True)
        if replica.connection is not None:
            replica.connection.close()

    def _schedulers(
        self, listing: Callable[[str], Sequence[ServerView]], clock: Clock
    ) -> tuple[DemandSource, dict[str, SchedulerCluster]]:
        static: list[PartitionDemand] = []
        sources: list[DemandSource] = []
        planes: dict[str, SchedulerCluster] = {}
        for p in self.plans.values():
            twin = self.twins.get(p.name)
            part = Partition(p.name, "swarm", _kind(p.kind))
            if isinstance(twin, SimSlurm):
                # Another installation on the cluster has a Slurm partition of its own.
                queue = ("batch",) if self.name == BLUE else (f"batch-{self.name}",)
                tools = SlurmCaller(twin, self.name, self._owner_of_node)
                view = SlurmView(tools, list(queue), ttl_s=0.0)  # type: ignore[arg-type]
                sp = SlurmPartition(
                    p.name, queue, Size(CPUS, MEMORY_MB), REQUEUE_LEAD_S, 120.0, self.name
                )
                spec = SlurmDemandSpec(part, sp, p.floor, p.max_units, p.max_units)
                sources.append(SlurmDemandSource(view, [spec], listing))
                planes[p.name] = SlurmNodes(view, {p.name: sp}, listing, clock)
                continue
            if isinstance(twin, SimKube):
                kube = kube_partition(p.name, self.name, CPUS)
                caller = KubeCaller(twin, self.name, self.region.installation_of)
                planes[p.name] = kube_plane(
                    caller, twin, kube, listing, clock, self.region.pools(), KUBE_GRACE_S
                )
                if self.name == BLUE:  # the workload is blue's; another's demand is its file
                    wants = KubeDemandSpec(part, kube, p.floor, p.max_units, p.max_units)
                    sources.append(kube_intake(twin, wants, listing, self.region.pools()))
                    continue
            steps = UnitSeries(steps=tuple((float(t), n) for t, n in p.targets))
            static.append(
                PartitionDemand(part, steps, UnitSeries(constant=p.floor), p.max_units, p.max_units)
            )
        return DemandRouter([FileDemandSource(static, START_S), *sources], list(self.plans)), planes

    def _owner_of_node(self, node: str) -> str | None:
        """The installation whose server a Slurm node is, as the cloud says."""
        if node not in self._node_servers:
            self._node_servers = {
                node_name(v.server_id): v.server_id for v in self.region.all_servers()
            }
        sid = self._node_servers.get(node)
        return self.region.installation_of(sid) if sid is not None else None

    def close(self) -> None:
        for slot in list(self.replicas):
            self.stop(slot)
        self.agents.close()
        self._close()


class _Listing:
    """The replica's last listing of each partition (what node planes map nodes by)."""

    def __init__(self, cloud: CloudFaults) -> None:
        self.cloud = cloud

    def __call__(self, partition: str) -> Sequence[ServerView]:
        return self.cloud.last.get(partition, ())


def _kind(kind: str) -> SchedulerKind:
    return SchedulerKind.KUBERNETES if kind == "kubernetes" else SchedulerKind.SLURM
