"""Runners for tests, made the one way sco makes them: by `sco.engine.builder`, from a
bundle of ports. A test that needs a different construction path has found a port
the product is missing."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import cast

from sco.decide.policies import Policy, ScoPolicy
from sco.domain.demand import Partition
from sco.engine import builder
from sco.engine.builder import FleetState, NodeTokens, Ports
from sco.engine.clock import IdSource, UuidIds
from sco.engine.controller import PartitionController
from sco.engine.cycle import ControllerConfig
from sco.engine.realtime import RealtimeRunner, RoundReport
from sco.engine.signals import FleetSignals
from sco.ports import (
    Clock,
    DemandSource,
    FleetStore,
    LeaseStore,
    Provider,
    SchedulerCluster,
)


def ports_of(
    provider: Provider,
    nodes: SchedulerCluster,
    store: FleetStore,
    demand: DemandSource,
    clock: Clock,
    *,
    ids: IdSource | None = None,
    leases: LeaseStore | None = None,
    tokens: NodeTokens | None = None,
    relay: Callable[[], int] | None = None,
    calls: int | Executor = 0,
) -> Ports:
    return Ports(
        provider=provider,
        nodes=nodes,
        demand=demand,
        state=FleetState.of(store),
        clock=clock,
        ids=ids or UuidIds(),
        leases=leases,
        relay=relay,
        tokens=tokens,
        calls=calls,
    )


def controller_of(
    ports: Ports,
    policy: Callable[[], Policy] = ScoPolicy,
    config: ControllerConfig | None = None,
    partition: Partition | None = None,
    signals: FleetSignals | None = None,
) -> PartitionController:
    """The controller of `partition` (default: the demand's first), as a simulation
    makes it: no lease, calls as `ports` say."""
    chosen = partition or ports.demand.partitions()[0]
    return builder.controllers(ports, policy, config, signals, [chosen])[0]


@dataclass
class Rounds:
    """Every partition's controller cycled a round at a time on the wall clock (a real
    cloud, stepped by a test), and the fleet state they write."""

    runner: RealtimeRunner
    store: FleetStore

    def round(self) -> RoundReport:
        return self.runner.round()


def rounds_of(
    ports: Ports,
    policy: Callable[[], Policy] = ScoPolicy,
    config: ControllerConfig | None = None,
    degraded: Callable[[], str] = lambda: "",
) -> Rounds:
    runner = builder.round_runner(ports, policy, config, degraded)
    return Rounds(runner, cast(FleetStore, ports.state.records))
