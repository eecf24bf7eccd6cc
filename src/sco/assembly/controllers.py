"""From `sco.yaml` to `sco run`: the real world in the builder's bundle of ports (the
cloud, every partition's scheduler, fleet state, the event log, leases, node
tokens), the replica the builder makes from it, and the dry run's look at it.

What the cloud adapter knows beyond the port (the credential's excess rights,
foreign servers in sco's projects, the credential's version) is read here and
handed to the command as metrics and one warning line, never reached into.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from sco.assembly.planes import scheduler_plane
from sco.assembly.sections import ProviderSettings
from sco.assembly.settings import Settings
from sco.assembly.wiring import (
    StartError,
    node_tokens,
    open_events,
    open_leases,
    open_store,
    patiently,
    require,
)
from sco.decide.policies import Policy, ScoPolicy, policy_named
from sco.domain.plans import Plan
from sco.engine import builder
from sco.engine.builder import FleetState, Ports, Pumping
from sco.engine.clock import SystemClock
from sco.engine.cycle import CycleReport
from sco.engine.dryrun import Intent
from sco.engine.metrics import CredentialMetrics, PlacementMetrics
from sco.engine.realtime import RoundReport, line, summary
from sco.engine.replicas import ReplicaConfig, ReplicaRunner
from sco.ports import PlanStore, ProviderError

if TYPE_CHECKING:  # an extra: imported when a command uses it
    from sco.adapters.openstack.provider import OpenStackProvider

__all__ = [
    "Controllers",
    "CycleReport",
    "Look",
    "controllers",
    "dry_run",
    "line",
    "scope_warning",
    "start_openstack",
    "summary",
]

log = logging.getLogger(__name__)


def start_openstack(
    settings: ProviderSettings, creates: bool, installation: str = "default"
) -> OpenStackProvider:
    """Load the region file, connect, resolve every pool, take sco's projects and
    read headroom once, so a wrong cloud, credential, project, endpoint, flavor or
    aggregate stops us here. `creates`: the command creates servers (its credential
    must then be scoped to one of sco's projects); `installation`: whose servers
    these are among the installations sharing the project."""
    from sco.adapters.openstack import RegionError, open_provider
    from sco.adapters.openstack.config import RegionFileError, load_region
    from sco.adapters.openstack.scope import ScopeError
    from sco.assembly.secrets import secret_source

    region_file, cloud = settings.region_file, settings.cloud
    for name, value in (("cloud", cloud), ("region_file", region_file)):
        if value is None:
            raise StartError(f"provider.{name}: not set (in sco.yaml, or a flag)")
    assert region_file is not None
    assert cloud is not None
    try:
        region = load_region(region_file)
    except RegionFileError as e:
        raise StartError(f"provider.region_file: {e}") from None
    clouds_file = str(settings.clouds_file) if settings.clouds_file else None
    clock = SystemClock()
    secrets = secret_source(region, clock)
    provider = open_provider(region, cloud, secrets, clock, clouds_file, installation)
    try:
        provider.discover()
        provider.claim(settings.projects, creates, settings.roles)
        provider.refresh()
    except RegionError as e:
        raise StartError(f"cloud {cloud!r} does not match {region_file}: {e}") from None
    except ScopeError as e:
        raise StartError(f"provider.projects: cloud {cloud!r}: {e}") from None
    except ProviderError as e:
        raise StartError(f"cloud {cloud!r}: {e}") from None
    return provider


def scope_warning(provider: OpenStackProvider) -> str:
    """One line when the credential could do more than sco needs, else ""."""
    if not provider.excess or provider.scope is None:
        return ""
    return (
        f"credential could do more than sco needs: {'; '.join(provider.excess)} "
        f"[{provider.scope.describe()}]; sco needs a project-scoped credential with "
        f"provider.roles only (docs/security.md)"
    )


def policy_factory(settings: Settings) -> Callable[[], Policy]:
    """A new policy per partition (baselines remember what they saw); the `sco`
    policy with the configured hedge."""
    name = settings.policy.name
    policy_named(name)  # an unknown name fails here, before anything connects
    if name == "sco":
        return lambda: ScoPolicy(settings.policy.hedge)
    return lambda: policy_named(name)


@dataclass
class Controllers:
    """`sco run`'s world, opened: the ports the builder makes a replica from."""

    settings: Settings
    ports: Ports
    warning: str  # one line when the credential could do more than sco needs
    describe: str  # what the event log and the leases are, for the start line
    _provider: OpenStackProvider

    def replica(
        self,
        name: str,
        registry: CollectorRegistry,
        on_report: Callable[[CycleReport], None],
        cycles: int | None = None,
        sleep: Callable[[float], object] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> tuple[ReplicaRunner, Callable[[], None]]:
        """The replica named `name`, its metrics in `registry`, and what refreshes the
        credential's metrics (after each cycle). Its start writes the pools to fleet
        state: a database failing over just then is waited for (`state.start_wait_s`),
        as the store's opening waits, rather than ending the process."""
        provider = self._provider
        credential = CredentialMetrics(
            registry,
            provider.excess,
            provider.foreign_servers,
            lambda: provider.refused_total,
            provider.held_credential,
        )
        s = self.settings
        ttl = s.leases.ttl_s
        metrics = PlacementMetrics(registry)
        pumping = Pumping(registry=registry)

        def start() -> ReplicaRunner:
            return builder.replica(
                self.ports,
                ReplicaConfig(name, lease_ttl_s=ttl, act_margin_s=ttl / 3),
                policy_factory(s),
                s.policy.interval_s,
                controller=s.policy.controller,
                cycles=cycles,
                metrics=metrics,
                on_report=on_report,
                pumping=pumping,
            )

        runner = patiently(start, "state.url", s.state.start_wait_s, sleep, monotonic)
        return runner, credential.refresh

    def start(self) -> None:
        """Keep the cloud's view fresh in the background (headroom, prices, listings)."""
        self._provider.start_refresher()


@contextmanager
def controllers(settings: Settings) -> Iterator[Controllers]:
    """Open `sco run`'s world as `sco.yaml` says (a cloud that does not match, a
    scheduler or database that cannot be reached stop it here: `StartError`), and
    close all of it at the end."""
    require(settings, "provider.cloud", "provider.region_file", partitions=True)
    policy_factory(settings)
    provider = start_openstack(settings.provider, creates=True, installation=settings.installation)
    closers: list[Callable[[], None]] = [provider.stop]
    try:
        clock = SystemClock()
        store = open_store(settings, patient=True)
        closers.append(store.close)
        plane = scheduler_plane(
            settings, provider.region.region, clock.now(), provider.last_listing, clock,
            acks=store.contracts, pools=list(provider.pools()),
        )  # fmt: skip
        closers.append(plane.close)
        events = open_events(settings, store, patient=True)
        closers.append(events.close)
        ports = Ports(
            provider=provider,
            nodes=plane.nodes,
            demand=plane.demand,
            state=FleetState.of(store),
            clock=clock,
            leases=open_leases(settings, store),
            events=events.log,
            relay=events.relay,
            tokens=node_tokens(settings, store.contracts, provider),
            calls=settings.provider.calls_in_flight,
        )
        yield Controllers(
            settings,
            ports,
            scope_warning(provider),
            f"events {events.kind}, leases {settings.leases.kind}",
            provider,
        )
    finally:
        for close in reversed(closers):
            close()


@dataclass(frozen=True, slots=True)
class Look:
    """What a dry run saw and would have done."""

    report: RoundReport
    plans: list[Plan]
    intents: list[Intent]


def dry_run(settings: Settings) -> Look:
    """One round on a scratch fleet state through a provider and node planes that only
    write down what they would create, delete and drain: it acts on nothing."""
    from sco.adapters.sqlstate.engine import sqlite_url
    from sco.adapters.sqlstate.store import SqlFleetStore

    require(settings, "provider.cloud", "provider.region_file", partitions=True)
    policy = policy_factory(settings)
    provider = start_openstack(settings.provider, creates=True, installation=settings.installation)
    clock = SystemClock()
    try:
        plane = scheduler_plane(
            settings, provider.region.region, clock.now(), provider.last_listing, clock,
            pools=list(provider.pools()), read_only=True,
        )  # fmt: skip
    except BaseException:
        provider.stop()
        raise
    try:
        with tempfile.TemporaryDirectory(prefix="sco-dry-run-") as scratch:
            store = SqlFleetStore(sqlite_url(Path(scratch) / "state.sqlite"))
            try:
                ports = Ports(provider, plane.nodes, plane.demand, FleetState.of(store), clock)
                dry = builder.dry_run(
                    ports,
                    FleetState.of(store),
                    policy,
                    settings.policy.controller,
                    degraded=provider.degraded,
                )
                try:
                    report = dry.runner.round()
                finally:
                    dry.runner.close()
                plans = _plans(store, [c.partition.name for c in dry.runner.controllers])
            finally:
                store.close()
    finally:
        provider.stop()
        plane.close()
    return Look(report, plans, dry.intents)


def _plans(store: PlanStore, partitions: Sequence[str]) -> list[Plan]:
    return [p for p in (store.latest_plan(name) for name in partitions) if p is not None]
