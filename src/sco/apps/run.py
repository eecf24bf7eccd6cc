"""`sco run`: the controllers against a real cloud, on the wall clock."""

from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

import click

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import policy_named
from sco.ports import ProviderError
from sco.runtime.clock import SystemClock
from sco.runtime.dryrun import DryRunProvider, Intent
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
) -> int:
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
    store = SqlFleetStore(state_url)
    stop = threading.Event()
    _stop_on_signals(stop)
    provider.start_refresher()
    try:
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
        return runner.run(stop, rounds=1 if dry_run else rounds, on_round=_echo_round)
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
