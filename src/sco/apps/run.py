"""`sco run`: the controllers against a real cloud, on the wall clock."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sco.apps.process import process
from sco.assembly.planes import SchedulerPlane, scheduler_plane
from sco.assembly.sections import ProviderSettings
from sco.assembly.settings import Settings
from sco.assembly.wiring import (
    StartError,
    open_events,
    open_leases,
    open_store,
    require,
    token_issuers,
)
from sco.decide.policies import Policy, ScoPolicy, policy_named
from sco.engine.clock import SystemClock
from sco.engine.controller import CycleReport
from sco.engine.dryrun import DryRunNodes, DryRunProvider, Intent
from sco.engine.metrics import PlacementMetrics
from sco.engine.pump import SignalPump
from sco.engine.realtime import RealtimeRunner, line, summary
from sco.ports import ProviderError

if TYPE_CHECKING:  # an extra: imported when a command uses it
    from sco.adapters.openstack.provider import OpenStackProvider

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
    provider = open_provider(region, cloud, SystemClock(), clouds_file, installation)
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


def run_controllers(
    settings: Settings,
    *,
    replica: str | None = None,
    cycles: int | None = None,
    dry_run: bool = False,
    verbose: int = 0,
) -> int:
    """The controllers until stopped. With a database shared by several `sco run`
    processes, each leads some partitions (`replica` names this one; it must be unique
    per process). A dry run takes no lease and acts on nothing. Returns the cycles run."""
    require(settings, "provider.cloud", "provider.region_file", partitions=True)
    policy = policy_factory(settings)
    provider = start_openstack(settings.provider, creates=True, installation=settings.installation)
    clock = SystemClock()
    region, pools = provider.region.region, list(provider.pools())
    if dry_run:
        plane = scheduler_plane(
            settings, region, clock.now(), provider.last_listing, clock, pools=pools
        )
        try:
            return _dry_run(settings, provider, plane, policy)
        finally:
            plane.close()
    store = open_store(settings, patient=True)
    plane = scheduler_plane(
        settings, region, clock.now(), provider.last_listing, clock,
        acks=store.contracts, pools=pools,
    )  # fmt: skip
    events = open_events(settings, store, patient=True)
    leases = open_leases(settings, store)
    name = replica or default_replica_name()
    done: list[CycleReport] = []
    try:
        with process("run", settings, settings.http.run_port, verbose) as proc:
            from sco.engine.metrics import CredentialMetrics
            from sco.engine.replicas import ReplicaConfig, ReplicaRunner

            if warning := scope_warning(provider):
                log.warning("%s", warning)
            credential = CredentialMetrics(
                proc.registry,
                provider.excess,
                provider.foreign_servers,
                lambda: provider.refused_total,
                provider.held_credential,
            )

            def on_report(report: CycleReport) -> None:
                done.append(report)
                credential.refresh()
                if report.transitions or report.degraded or report.created:
                    click.echo(line(report), err=True)

            ttl = settings.leases.ttl_s
            runner = ReplicaRunner(
                config=ReplicaConfig(
                    name,
                    lease_ttl_s=ttl,
                    act_margin_s=ttl / 3,
                    calls_in_flight=settings.provider.calls_in_flight,
                ),
                leases=leases,
                provider=provider,
                nodes=plane.nodes,
                store=store,
                demand=plane.demand,
                policy=policy,
                clock=clock,
                interval_s=settings.policy.interval_s,
                controller=settings.policy.controller,
                metrics=PlacementMetrics(proc.registry),
                on_report=on_report,
                pump=lambda wake: SignalPump(
                    store=store,
                    provider=provider,
                    pools=list(provider.pools()),
                    relay=events.relay,
                    clock=clock,
                    on_signals=wake,
                    registry=proc.registry,
                ),
                cycles=cycles,
                tokens=token_issuers(settings, store.contracts, provider),
            )
            proc.checks(live=runner.health, ready=runner.ready)
            click.echo(
                f"sco run: replica {name}, {len(runner.partitions)} partitions, "
                f"events {events.kind}, leases {settings.leases.kind}",
                err=True,
            )
            provider.start_refresher()
            try:
                runner.run(proc.stop)
            finally:
                runner.shutdown()
    finally:
        provider.stop()
        plane.close()
        events.close()
        store.close()
    return len(done)


def _dry_run(
    settings: Settings,
    provider: OpenStackProvider,
    plane: SchedulerPlane,
    policy: Callable[[], Policy],
) -> int:
    """One round on a scratch state through a provider that only writes down what it
    would create and delete; prints that, and the plans' reasons."""
    from sco.adapters.sqlstate.engine import sqlite_url
    from sco.adapters.sqlstate.store import SqlFleetStore

    acting = DryRunProvider(provider)
    with tempfile.TemporaryDirectory(prefix="sco-dry-run-") as scratch:
        store = SqlFleetStore(sqlite_url(Path(scratch) / "state.sqlite"))
        try:
            runner = RealtimeRunner(
                provider=acting,
                nodes=DryRunNodes(plane.nodes, acting.intents),
                store=store,
                demand=plane.demand,
                policy=policy,
                clock=SystemClock(),
                config=settings.policy.controller,
                degraded=provider.degraded,
            )
            report = runner.round()
            plans = [store.latest_plan(c.partition.name) for c in runner.controllers]
        finally:
            store.close()
            provider.stop()
    for text in summary(report):
        click.echo(text, err=True)
    for plan in plans:
        for pool, why in sorted((plan.pools if plan else {}).items()):
            terms = ", ".join(f"{k} {v:.3g}" for k, v in why.terms.items() if v)
            click.echo(
                f"{plan.partition if plan else ''}: why: {pool} target {why.target}"
                + (f" ({terms})" if terms else "")
                + (f" [{', '.join(why.flags)}]" if why.flags else ""),
                err=True,
            )
    _echo_intents(acting.intents)
    return 1


def _echo_intents(intents: list[Intent]) -> None:
    if not intents:
        click.echo("dry run: nothing to create or delete")
        return
    for i in intents:
        click.echo(f"would {i.action} {i.count} in {i.pool} ({i.detail})")


def default_replica_name() -> str:
    """Unique per process: a restarted process must never pass for its previous self,
    or it would inherit that one's fencing tokens."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
