"""`sco run`: the controllers against a real cloud, on the wall clock."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

import click
from prometheus_client import start_http_server
from sqlalchemy.exc import OperationalError

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import policy_named
from sco.ports import ProviderError
from sco.runtime.clock import SystemClock
from sco.runtime.dryrun import DryRunProvider, Intent
from sco.runtime.metrics import PlacementMetrics
from sco.runtime.realtime import RealtimeRunner, RoundReport, summary


class StartError(Exception):
    """Something named on the command line cannot be used; exit 2."""


def start_openstack(region_file: Path, cloud: str) -> Any:
    """Load the region file, connect, resolve every pool and read headroom once,
    so a wrong cloud, credential, endpoint, flavor or aggregate stops us here."""
    from sco.adapters.openstack import RegionError, open_provider
    from sco.adapters.openstack.config import RegionFileError, load_region

    try:
        region = load_region(region_file)
    except RegionFileError as e:
        raise StartError(f"--region: {e}") from None
    provider = open_provider(region, cloud, SystemClock())
    try:
        provider.discover()
        provider.refresh()
    except RegionError as e:
        raise StartError(f"cloud {cloud!r} does not match {region_file}: {e}") from None
    except ProviderError as e:
        raise StartError(f"cloud {cloud!r}: {e}") from None
    return provider


def run_controllers(
    provider: Any,
    demand_file: Path,
    state_url: str | None,
    policy: str,
    interval_s: float,
    rounds: int | None,
    dry_run: bool,
    replica: str | None = None,
    lease_ttl_s: float = 15.0,
    metrics_port: int | None = None,
) -> int:
    """The controllers until stopped. With a database shared by several `sco run`
    processes, each holds the leases of some partitions (`replica` names this one;
    it must be unique per process). A dry run takes no lease."""
    from sco.adapters.standalone import ServersAsNodes

    clock = SystemClock()
    policy_named(policy)  # fail on a bad name before connecting anything else
    demand = FileDemandSource.load(demand_file, provider.region.region, clock.now())
    acting: Any = DryRunProvider(provider) if dry_run else provider
    nodes = ServersAsNodes(provider.last_listing)
    scratch = tempfile.TemporaryDirectory(prefix="sco-dry-run-") if dry_run else None
    if scratch is not None:
        state_url = f"sqlite:///{Path(scratch.name) / 'state.sqlite'}"
    assert state_url is not None
    store = _open_store(state_url)
    metrics = PlacementMetrics()
    if metrics_port is not None and not dry_run:
        start_http_server(metrics_port, addr="0.0.0.0", registry=metrics.registry)
        click.echo(f"sco run: metrics on :{metrics_port}/metrics", err=True)
    stop = threading.Event()
    _stop_on_signals(stop)
    provider.start_refresher()
    try:
        if not dry_run:
            return _run_replica(
                provider,
                nodes,
                store,
                demand,
                policy,
                interval_s,
                rounds,
                stop,
                replica or default_replica_name(),
                lease_ttl_s,
                metrics,
            )
        runner = RealtimeRunner(
            provider=acting,
            nodes=nodes,
            store=store,
            demand=demand,
            policy=lambda: policy_named(policy),
            clock=clock,
            interval_s=interval_s,
            degraded=provider.degraded,
        )
        return runner.run(stop, rounds=1, on_round=_echo_round)  # a dry run looks once
    finally:
        provider.stop()
        store.close()
        if dry_run:
            _echo_intents(acting.intents)
        if scratch is not None:
            scratch.cleanup()


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        click.echo(f"sco run: signal {signum}, stopping after this round", err=True)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _echo_round(report: RoundReport) -> None:
    for line in summary(report):
        click.echo(line, err=True)


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


def _open_store(url: str) -> SqlFleetStore:
    try:
        return SqlFleetStore(url)
    except OperationalError as e:
        raise StartError(f"--state: cannot reach the database: {_first_line(e)}") from None


def _first_line(e: OperationalError) -> str:
    return str(e.orig).strip().splitlines()[0] if e.orig else type(e).__name__


def _run_replica(
    provider: Any,
    nodes: Any,
    store: SqlFleetStore,
    demand: FileDemandSource,
    policy: str,
    interval_s: float,
    rounds: int | None,
    stop: threading.Event,
    name: str,
    lease_ttl_s: float,
    metrics: PlacementMetrics,
) -> int:
    from sco.adapters.sqlstate.leases import SqlLeases
    from sco.runtime.replicas import LeaseChange, ReplicaConfig, ReplicaRunner

    def on_lease(change: LeaseChange) -> None:
        if change.event != "renewed":
            click.echo(
                f"replica {name}: {change.partition} lease {change.event} (token {change.token})",
                err=True,
            )

    runner = ReplicaRunner(
        config=ReplicaConfig(name, lease_ttl_s=lease_ttl_s, act_margin_s=lease_ttl_s / 3),
        leases=SqlLeases(store.engine),
        provider=provider,
        nodes=nodes,
        store=store,
        demand=demand,
        policy=lambda: policy_named(policy),
        clock=SystemClock(),
        interval_s=interval_s,
        on_lease=on_lease,
        metrics=metrics,
    )
    click.echo(f"sco run: replica {name}", err=True)
    try:
        return runner.run(
            stop,
            rounds=rounds,
            on_round=lambda reports: _echo_round(
                RoundReport(0.0, tuple(reports), provider.degraded())
            ),
        )
    finally:
        runner.shutdown()
