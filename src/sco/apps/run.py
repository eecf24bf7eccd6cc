"""`sco run`: the controllers against a real cloud, on the wall clock."""

from __future__ import annotations

import logging
import os
import secrets
import socket

import click

from sco.apps.process import process
from sco.assembly.controllers import CycleReport, controllers, dry_run, line, summary
from sco.assembly.settings import Settings

log = logging.getLogger(__name__)


def run_controllers(
    settings: Settings,
    *,
    replica: str | None = None,
    cycles: int | None = None,
    dry_run_only: bool = False,
    verbose: int = 0,
) -> int:
    """The controllers until stopped. With a database shared by several `sco run`
    processes, each leads some partitions (`replica` names this one; it must be unique
    per process). A dry run takes no lease and acts on nothing. Returns the cycles run."""
    if dry_run_only:
        return _dry_run(settings)
    name = replica or default_replica_name()
    done: list[CycleReport] = []
    with (
        controllers(settings) as world,
        process("run", settings, settings.http.run_port, verbose) as proc,
    ):
        if world.warning:
            log.warning("%s", world.warning)

        def on_report(report: CycleReport) -> None:
            done.append(report)
            refresh()
            if report.transitions or report.degraded or report.created:
                click.echo(line(report), err=True)

        runner, refresh = world.replica(name, proc.registry, on_report, cycles)
        proc.checks(live=runner.health, ready=runner.ready)
        click.echo(
            f"sco run: replica {name}, {len(runner.partitions)} partitions, {world.describe}",
            err=True,
        )
        world.start()
        try:
            runner.run(proc.stop)
        finally:
            runner.shutdown()
    return len(done)


def _dry_run(settings: Settings) -> int:
    """One round on a scratch state: prints what would be created and deleted, and the
    plans' reasons."""
    look = dry_run(settings)
    for text in summary(look.report):
        click.echo(text, err=True)
    for plan in look.plans:
        for pool, why in sorted(plan.pools.items()):
            terms = ", ".join(f"{k} {v:.3g}" for k, v in why.terms.items() if v)
            click.echo(
                f"{plan.partition}: why: {pool} target {why.target}"
                + (f" ({terms})" if terms else "")
                + (f" [{', '.join(why.flags)}]" if why.flags else ""),
                err=True,
            )
    if not look.intents:
        click.echo("dry run: nothing to create or delete")
    for i in look.intents:
        click.echo(f"would {i.action} {i.count} in {i.pool} ({i.detail})")
    return 1


def default_replica_name() -> str:
    """Unique per process: a restarted process must never pass for its previous self,
    or it would inherit that one's fencing tokens."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
