"""The long-running commands, one per container of the seed, all reading `sco.yaml`:
`sco run`, `sco watch`, `sco score`, `sco history load`, `sco distributor` and
`sco status`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sco.apps.common import BadInput, parse_duration
from sco.apps.listen import listening
from sco.apps.options import config_option, settings_of, start_errors, state_override, verbose_level
from sco.assembly.state import open_fleet


@click.command()
@config_option
@click.option(
    "--provider",
    type=click.Choice(["openstack"]),
    default=None,
    help="Where servers come from (provider.kind).",
)
@click.option("--cloud", default=None, help="Cloud name in clouds.yaml (provider.cloud).")
@click.option(
    "--region",
    "region_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Region file: pools, image, network (provider.region_file).",
)
@click.option(
    "--demand",
    "demand_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Demand file: partitions and their units (demand_file).",
)
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--policy", default=None, help="Placement policy by name (policy.name).")
@click.option("--interval", default=None, help="Time between a partition's cycles (15s).")
@click.option("--cycles", type=int, default=None, help="Stop after this many cycles a partition.")
@click.option(
    "--replica",
    default=None,
    help="This process's name among replicas sharing the state (default: host-pid-random).",
)
@click.option("--lease-ttl", default=None, help="Partition lease time to live (leases.ttl_s).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="/metrics, /healthz and /readyz on this port (http.run_port; 0: none).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="One round that prints what would be created and deleted, and why; acts on nothing.",
)
def run(
    config: Path | None,
    provider: str | None,
    cloud: str | None,
    region_file: Path | None,
    demand_file: Path | None,
    state: str | None,
    policy: str | None,
    interval: str | None,
    cycles: int | None,
    replica: str | None,
    lease_ttl: str | None,
    metrics_port: int | None,
    dry_run: bool,
) -> None:
    """Run the controllers against a real cloud, until stopped (SIGTERM/SIGINT).

    Several processes may share one state database: each leads a fair share of the
    partitions and takes over those of a replica that dies. Stopping sco leaves the
    servers it created running; `sco handback` gives a partition's capacity back."""
    from sco.apps.run import run_controllers

    if cycles is not None and cycles < 1:
        raise BadInput("--cycles: must be >= 1")
    ttl = parse_duration(lease_ttl, "--lease-ttl") if lease_ttl else None
    if ttl is not None and ttl < 3:
        raise BadInput("--lease-ttl: must be at least 3s")
    if demand_file is not None and not demand_file.is_file():
        raise BadInput(f"--demand: {demand_file}: no such file")
    settings = settings_of(
        config,
        {
            "provider.kind": provider,
            "provider.cloud": cloud,
            "provider.region_file": str(region_file) if region_file else None,
            "demand_file": str(demand_file) if demand_file else None,
            "partitions": [] if demand_file else None,
            "state.url": state_override(state),
            "policy.name": policy,
            "policy.interval_s": parse_duration(interval, "--interval") if interval else None,
            "leases.ttl_s": ttl,
            "http.run_port": metrics_port,
        },
    )
    with start_errors():
        n = run_controllers(
            settings, replica=replica, cycles=cycles, dry_run_only=dry_run, verbose=verbose_level()
        )
    click.echo(f"sco run: {n} cycles", err=True)


# ---------------------------------------------------------------- signals


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="http.watch_port.")
def watch(config: Path | None, state: str | None, port: int | None) -> None:
    """The exclusion watcher: reads the event log continuously and takes pools that go
    bad out of placement (exclusions in fleet state, acted on by every controller)."""
    from sco.apps.signals import watch as run_watch

    settings = settings_of(config, {"state.url": state_override(state), "http.watch_port": port})
    with start_errors():
        run_watch(settings, verbose_level())


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--history", default=None, help="Pool history: chdb://PATH or http://host:8123.")
@click.option(
    "--every",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[DURATION]",
    help="Score every so often (5m) until stopped; alone, every policy.score_every_s.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="http.score_port: /metrics and health while scoring --every.",
)
def score(
    config: Path | None, state: str | None, history: str | None, every: str | None, port: int | None
) -> None:
    """The pool scorer: reads pool history and writes a new score generation to fleet
    state. One pass (as a CronJob runs it), or --every; exits non-zero when history
    cannot be read."""
    from sco.apps.signals import score as run_score

    if every is None and port is not None:
        # One pass ends before anything could scrape it: it serves no port.
        raise BadInput("--port: one pass serves no port; give --every to score in a loop")
    settings = settings_of(
        config,
        {"state.url": state_override(state), "history.url": history, "http.score_port": port},
    )
    every_s = _every_s(every, "--every", settings.policy.score_every_s)
    with start_errors():
        run_score(settings, every_s, verbose_level())


def _every_s(given: str | None, option: str, default_s: float) -> float | None:
    """A loop's period: None (the option not given: one pass), the option's duration,
    or `default_s` (policy.score_every_s) when it is given without one."""
    if given is None:
        return None
    every_s = parse_duration(given, option) if given else default_s
    if every_s <= 0:
        raise BadInput(f"{option}: must be > 0")
    return every_s


@click.group()
def history() -> None:
    """Pool history (ClickHouse, or chDB embedded)."""


@history.command("load")
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--history", "url", default=None, help="Pool history: chdb://PATH or http://...")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="http.history_port.")
@click.option(
    "--score-every",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[DURATION]",
    help="Also score pools this often (5m; alone, every policy.score_every_s), in this "
    "process: on chDB, instead of `sco score --every` (one process holds the engine).",
)
def history_load(
    config: Path | None, state: str | None, url: str | None, port: int | None,
    score_every: str | None,
) -> None:  # fmt: skip
    """Load the event log into pool history, continuously and idempotently (an event
    loaded twice counts once)."""
    from sco.apps.signals import load_history

    settings = settings_of(
        config, {"state.url": state_override(state), "history.url": url, "http.history_port": port}
    )
    every_s = _every_s(score_every, "--score-every", settings.policy.score_every_s)
    with start_errors():
        load_history(settings, verbose_level(), every_s)


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--bind", default=None, help="Address to listen on (distributor.bind).")
@click.option("--port", type=int, default=None, help="Port (distributor.port).")
def distributor(config: Path | None, state: str | None, bind: str | None, port: int | None) -> None:
    """Serve node contracts: each node reads its own and long-polls for changes, and its
    agent acknowledges drains. Stateless: run several replicas behind one service."""
    try:
        import uvicorn

        from sco.apps.distributor import DistributorConfig, create_app
    except ModuleNotFoundError as e:
        raise BadInput(f"{e.name} is not installed (pip install 'sco[distributor]')") from None
    from sco.apps import logs
    from sco.assembly.state import open_fleet

    settings = settings_of(
        config,
        {"state.url": state_override(state), "distributor.bind": bind, "distributor.port": port},
    )
    d = settings.distributor
    logs.setup("distributor", settings.log.level, settings.log.format)
    with start_errors():
        store = open_fleet(settings, patient=True)
    joins = {p.name: _join_of(p) for p in settings.partitions}
    app = create_app(
        store.contracts,
        DistributorConfig(
            max_wait_s=d.max_wait_s,
            poll_s=d.poll_s,
            lease_s=d.lease_s,
            auth_failures_per_min=d.auth_failures_per_min,
            requests_per_s=d.requests_per_s,
            join=lambda partition: joins.get(partition, ""),
        ),
        listen=store.contracts.listener(),
    )
    sock = listening(d.bind, d.port, "distributor.port", "distributor")
    try:
        uvicorn.Server(
            uvicorn.Config(
                app,
                ssl_certfile=str(d.tls_cert) if d.tls_cert else None,
                ssl_keyfile=str(d.tls_key) if d.tls_key else None,
                log_config=None,
                access_log=False,  # a line per long poll is noise; /metrics counts them
                timeout_graceful_shutdown=5,
                # Agents poll again within a long poll's wait: keep their connections.
                timeout_keep_alive=75,
                backlog=4096,
            )
        ).run(sockets=[sock])
    finally:
        sock.close()
        store.close()


def _join_of(p: Any) -> str:
    """How a partition's nodes join their scheduler, as the contract says it."""
    if p.slurm is not None:
        return f"slurm:{p.slurm.cluster}"
    return str(p.kind)


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--bind", default=None, help="Address to listen on (http.status_bind).")
@click.option("--port", type=int, default=None, help="Port (http.status_port).")
def status(config: Path | None, state: str | None, bind: str | None, port: int | None) -> None:
    """Serve the status page: partitions (floor, target, ready by class), pools (score,
    exclusion and why), each plan with its reasons, and recent lifecycle events, as
    HTML at / and as JSON at /status.json."""
    try:
        import uvicorn

        from sco.apps.status import create_app
    except ModuleNotFoundError as e:
        raise BadInput(f"{e.name} is not installed (pip install 'sco[status]')") from None
    import time

    from sco.apps import logs

    settings = settings_of(
        config,
        {"state.url": state_override(state), "http.status_bind": bind, "http.status_port": port},
    )
    logs.setup("status", settings.log.level, settings.log.format)
    with start_errors():
        store = open_fleet(settings, patient=True)
    http = settings.http
    sock = listening(http.status_bind, http.status_port, "http.status_port", "status")
    try:
        uvicorn.Server(
            uvicorn.Config(
                create_app(store, time.time),
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=5,
            )
        ).run(sockets=[sock])
    finally:
        sock.close()
        store.close()
