"""The one builder: every runner of sco, made from one typed bundle of ports.

`sco run`, its dry run, and the lab's demo, simulate, evaluate, replay and swarm
differ only in what fills `Ports`: real adapters (`sco.assembly`), the real ones
looked through and not touched (a dry run), or the lab's twins and simulated
sides. This module alone makes partition controllers, replica runners and the
executors their creates and deletes run on, so what the lab proves is what
`sco run` runs (a test holds every other module of `src/` to it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sco.decide.policies import Policy
from sco.domain.demand import Partition
from sco.engine.calls import InlineCalls
from sco.engine.clock import IdSource, UuidIds
from sco.engine.controller import PartitionController, Partitioned
from sco.engine.cycle import ControllerConfig, CycleReport
from sco.engine.dryrun import DryRunNodes, DryRunProvider, Intent
from sco.engine.metrics import PlacementMetrics
from sco.engine.pump import PumpConfig, SignalPump
from sco.engine.realtime import RealtimeRunner
from sco.engine.records import RecordStore
from sco.engine.replicas import ReplicaConfig, ReplicaRunner
from sco.engine.signals import FleetSignals
from sco.engine.tokens import TokenIssuer
from sco.ports import (
    Clock,
    DemandSource,
    EventLog,
    Fence,
    FleetStore,
    IntentStore,
    LeaseStore,
    Outbox,
    PoolHistory,
    Provider,
    SchedulerCluster,
    SignalStore,
    TokenCourier,
    TokenLedger,
)

Policies = Callable[[], Policy]  # a new policy per partition: baselines remember what they saw


@dataclass(frozen=True, slots=True)
class FleetState:
    """Fleet state by role: each part of a runner takes the role it needs."""

    records: RecordStore  # instances, reservations, plans: the controllers'
    signals: SignalStore  # exclusions, scores, pool ages, reclaims
    intents: IntentStore  # what operators asked of partitions
    outbox: Outbox  # events written with the changes that cause them

    @classmethod
    def of(cls, store: FleetStore) -> FleetState:
        """Every role from one store (one database, or one process's twin)."""
        return cls(store, store, store, store)


@dataclass(frozen=True, slots=True)
class NodeTokens:
    """Node tokens for the contract distributor's agents: where their digests are kept,
    how a server is handed its token, for how long one is good, and which partitions'
    nodes run `sco agent`."""

    ledger: TokenLedger
    courier: TokenCourier
    ttl_s: float
    partitions: frozenset[str]


@dataclass(frozen=True, slots=True)
class Ports:
    """Everything a runner is built from."""

    provider: Provider
    nodes: SchedulerCluster  # every partition's node plane (a router by partition)
    demand: DemandSource
    state: FleetState
    clock: Clock
    ids: IdSource = field(default_factory=UuidIds)
    leases: LeaseStore | None = None  # with membership and fencing: replicas need them
    events: EventLog | None = None
    relay: Callable[[], int] | None = None  # the outbox into `events`; returns how many
    history: PoolHistory | None = None
    tokens: NodeTokens | None = None
    # Where creates and deletes run (`sco.engine.calls`): a number of workers, as many
    # calls with the cloud at once (`sco run`); 0, each at once on the cycle's thread
    # (simulations, the swarm, one-shot runs); or an executor of the caller's (a test
    # that holds calls to answer them late).
    calls: int | Executor = 0


def call_executor(calls: int | Executor) -> Executor:
    """Where a runner's creates and deletes run: `calls` workers, (0) inline, or the
    executor given."""
    if isinstance(calls, Executor):
        return calls
    in_flight = calls
    if in_flight < 0:
        raise ValueError(f"calls in flight must be >= 0, got {in_flight}")
    if in_flight == 0:
        return InlineCalls()
    return ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="sco-calls")


def fleet_signals(ports: Ports, refresh_s: float = 0.0) -> FleetSignals:
    """The signals every controller of one process shares, read from fleet state at most
    every `refresh_s` of the ports' clock."""
    return FleetSignals(
        ports.state.signals, ports.state.intents, ports.provider.pools(), refresh_s=refresh_s
    )


def controller_maker(
    ports: Ports,
    policy: Policies,
    config: ControllerConfig,
    signals: FleetSignals,
    calls: Executor,
) -> Callable[[Partition, Fence], PartitionController]:
    """Makes a partition's controller (a fresh one loads its records and adopts servers
    on its first cycle), writing with `fence`."""
    tokens = ports.tokens
    issuer = TokenIssuer(tokens.ledger, tokens.courier, tokens.ttl_s) if tokens else None
    world = Partitioned(
        ports.provider, ports.nodes, ports.demand, signals, ports.clock, ports.ids, calls
    )

    agents = dataclasses.replace(world, tokens=issuer)

    def make(partition: Partition, fence: Fence) -> PartitionController:
        mine = agents if tokens is not None and partition.name in tokens.partitions else world
        return PartitionController(partition, mine, ports.state.records, fence, policy(), config)

    return make


def controllers(
    ports: Ports,
    policy: Policies,
    config: ControllerConfig | None = None,
    signals: FleetSignals | None = None,
    partitions: Sequence[Partition] | None = None,
) -> list[PartitionController]:
    """A controller for each partition (default: every partition of the demand), with no
    lease (fence 0) and calls as the ports say: a simulation's, stepped by its loop."""
    ports.state.records.upsert_pools(list(ports.provider.pools()))
    make = controller_maker(
        ports,
        policy,
        config or ControllerConfig(),
        signals or fleet_signals(ports),
        call_executor(ports.calls),
    )
    chosen = ports.demand.partitions() if partitions is None else partitions
    return [make(p, Fence(p.name)) for p in chosen]


def round_runner(
    ports: Ports,
    policy: Policies,
    config: ControllerConfig | None = None,
    degraded: Callable[[], str] = lambda: "",
    metrics: PlacementMetrics | None = None,
) -> RealtimeRunner:
    """Every partition's controller, cycled a round at a time on the wall clock (a dry
    run's one look; tests that step a real cloud round by round)."""
    signals = fleet_signals(ports, refresh_s=0.5)
    made = controllers(ports, policy, config, signals)
    return RealtimeRunner(
        controllers=made,
        signals=signals,
        clock=ports.clock,
        threads=ThreadPoolExecutor(max_workers=max(len(made), 1), thread_name_prefix="sco-round"),
        degraded=degraded,
        metrics=metrics,
    )


@dataclass(frozen=True, slots=True)
class DryRun:
    """A dry run's controllers, on scratch fleet state, and what they would have done."""

    runner: RealtimeRunner
    intents: list[Intent]


def dry_run(
    ports: Ports,
    scratch: FleetState,
    policy: Policies,
    config: ControllerConfig | None = None,
    degraded: Callable[[], str] = lambda: "",
) -> DryRun:
    """`sco run --dry-run`: the controllers of `ports` on `scratch` fleet state, through
    a provider and node planes that read the real ones and only write down what they
    would create, delete and drain (the schedulers' own deadline work is left to the
    controllers that lead the partitions)."""
    acting = DryRunProvider(ports.provider)
    looked = Ports(
        provider=acting,
        nodes=DryRunNodes(ports.nodes, acting.intents),
        demand=ports.demand,
        state=scratch,
        clock=ports.clock,
    )
    return DryRun(round_runner(looked, policy, config, degraded), acting.intents)


@dataclass(frozen=True, slots=True)
class Pumping:
    """How a replica's signal pump runs: its schedule, where its metrics go, and what
    times its steps (the shell's monotonic clock, or a simulation's own)."""

    config: PumpConfig = field(default_factory=PumpConfig)
    registry: CollectorRegistry | None = None
    pace: Callable[[], float] = time.monotonic


def replica(
    ports: Ports,
    config: ReplicaConfig,
    policy: Policies,
    interval_s: float,
    *,
    controller: ControllerConfig | None = None,
    cycles: int | None = None,
    metrics: PlacementMetrics | None = None,
    on_report: Callable[[CycleReport], None] | None = None,
    pumping: Pumping | None = None,
    signals_refresh_s: float = 0.5,
) -> ReplicaRunner:
    """A `sco run` replica: leads a fair share of the partitions through `ports.leases`,
    each partition's controller writing with its lease's fencing token; with `pumping`,
    a signal pump relays the outbox and wakes the partitions on new signals. Creates
    and deletes go where `ports.calls` says, except in one-shot runs
    (`cycles`), which keep them inline so that they end with every answer recorded."""
    if ports.leases is None:
        raise ValueError("a replica needs leases (ports.leases)")
    ports.state.records.upsert_pools(list(ports.provider.pools()))
    signals = fleet_signals(ports, refresh_s=signals_refresh_s)
    calls = call_executor(ports.calls if cycles is None else 0)
    make = controller_maker(ports, policy, controller or ControllerConfig(), signals, calls)
    pump = None
    if pumping is not None:
        pump = _pump_maker(ports, pumping)
    return ReplicaRunner(
        config=config,
        leases=ports.leases,
        partitions=ports.demand.partitions(),
        controller=make,
        signals=signals,
        clock=ports.clock,
        interval_s=interval_s,
        calls=calls,
        metrics=metrics,
        on_report=on_report,
        pump=pump,
        cycles=cycles,
    )


def _pump_maker(ports: Ports, pumping: Pumping) -> Callable[[Callable[[], None]], SignalPump]:
    pools = list(ports.provider.pools())

    def make(wake: Callable[[], None]) -> SignalPump:
        return SignalPump(
            outbox=ports.state.outbox,
            signals=ports.state.signals,
            provider=ports.provider,
            pools=pools,
            relay=ports.relay,
            clock=ports.clock,
            on_signals=wake,
            config=pumping.config,
            registry=pumping.registry,
            pace=pumping.pace,
        )

    return make
