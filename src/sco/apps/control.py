"""The control plane's commands, one per container of the seed, all reading `sco.yaml`.

    sco run              controllers, a leader per partition
    sco watch            exclusion watcher (continuous consumer of the event log)
    sco score            pool scorer (one pass, or --every 5m)
    sco history load     event log into pool history (continuous)
    sco explain P        the current plan of a partition, pool by pool, with reasons
    sco handback P       hand a partition back: drain and delete all it holds
    sco config check F   validate a configuration and print it resolved, secrets masked
    sco slurm conf P     the slurm.conf lines a Slurm partition's dynamic nodes need
    sco slurm usage P    node-hours of a Slurm partition's jobs by capacity class
    sco distributor      node contracts over HTTP, for the nodes' agents
    sco agent            on a node: follow its contract, leave before drain_by
    sco reclaim          the cloud operator's side: take spot servers back with notice
    sco tokens rotate P  revoke a partition's node tokens; new ones follow

`--config` (or `SCO_CONFIG`) names the file; every field can be overridden by a
`SCO_...` environment variable, and each command's flags override both.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from sco.apps.common import BadInput, console, parse_duration, state_url
from sco.apps.settings import Settings, SettingsError, load, mask_url, masked
from sco.apps.wiring import StartError, open_store

F = TypeVar("F", bound=Callable[..., Any])


def config_option(fn: F) -> F:
    return click.option(
        "--config",
        "config",
        type=click.Path(path_type=Path),
        envvar="SCO_CONFIG",
        default=None,
        help="sco.yaml (default: $SCO_CONFIG; without one, defaults and SCO_* variables).",
    )(fn)


def _settings(config: Path | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load(config, overrides)
    except SettingsError as e:
        raise BadInput(str(e)) from None


@contextmanager
def _start_errors() -> Iterator[None]:
    try:
        yield
    except StartError as e:
        raise BadInput(str(e)) from None


def _verbose() -> int:
    ctx = click.get_current_context()
    return int((ctx.find_root().params or {}).get("verbose") or 0)


def _state(settings_state: str | None) -> str | None:
    return state_url(settings_state, must_exist=False) if settings_state else None


# ---------------------------------------------------------------- sco run


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
    settings = _settings(
        config,
        {
            "provider.kind": provider,
            "provider.cloud": cloud,
            "provider.region_file": str(region_file) if region_file else None,
            "demand_file": str(demand_file) if demand_file else None,
            "partitions": [] if demand_file else None,
            "state.url": _state(state),
            "policy.name": policy,
            "policy.interval_s": parse_duration(interval, "--interval") if interval else None,
            "leases.ttl_s": ttl,
            "http.run_port": metrics_port,
        },
    )
    with _start_errors():
        n = run_controllers(
            settings, replica=replica, cycles=cycles, dry_run=dry_run, verbose=_verbose()
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

    settings = _settings(config, {"state.url": _state(state), "http.watch_port": port})
    with _start_errors():
        run_watch(settings, _verbose())


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--history", default=None, help="Pool history: chdb://PATH or http://host:8123.")
@click.option("--every", default=None, help="Score every so often (5m) until stopped.")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="http.score_port.")
def score(
    config: Path | None, state: str | None, history: str | None, every: str | None, port: int | None
) -> None:
    """The pool scorer: reads pool history and writes a new score generation to fleet
    state. One pass (as a CronJob runs it), or --every; exits non-zero when history
    cannot be read."""
    from sco.apps.signals import score as run_score

    every_s = parse_duration(every, "--every") if every else None
    if every_s is not None and every_s <= 0:
        raise BadInput("--every: must be > 0")
    settings = _settings(
        config, {"state.url": _state(state), "history.url": history, "http.score_port": port}
    )
    with _start_errors():
        run_score(settings, every_s, _verbose())


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
    default=None,
    help="Also score pools this often (5m), in this process: on chDB, instead of `sco score "
    "--every` (one process holds the engine).",
)
def history_load(
    config: Path | None, state: str | None, url: str | None, port: int | None,
    score_every: str | None,
) -> None:  # fmt: skip
    """Load the event log into pool history, continuously and idempotently (an event
    loaded twice counts once)."""
    from sco.apps.signals import load_history

    every_s = parse_duration(score_every, "--score-every") if score_every else None
    if every_s is not None and every_s <= 0:
        raise BadInput("--score-every: must be > 0")
    settings = _settings(
        config, {"state.url": _state(state), "history.url": url, "http.history_port": port}
    )
    with _start_errors():
        load_history(settings, _verbose(), every_s)


# ---------------------------------------------------------------- operators


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.argument("partition")
def explain(config: Path | None, state: str | None, as_json: bool, partition: str) -> None:
    """The current plan of PARTITION, pool by pool, with the reasons behind each count."""
    from sco.apps.explain import NothingToExplain, render
    from sco.apps.explain import explain as load_explanation

    url = state_url(state) if state else _settings(config, {}).state.url
    try:
        found = load_explanation(url, partition)
    except NothingToExplain as e:
        raise BadInput(str(e)) from None
    if as_json:
        click.echo(json.dumps(found.as_dict(), sort_keys=True))
    else:
        render(console(stderr=False), found)


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--cancel", is_flag=True, help="Take the partition back into service.")
@click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait until it holds nothing."
)
@click.option("--timeout", default="30m", show_default=True, help="How long to wait.")
@click.argument("partition")
def handback(
    config: Path | None,
    state: str | None,
    cancel: bool,
    wait: bool,
    timeout: str,
    partition: str,
) -> None:
    """Hand PARTITION's capacity back: its leader drains every node and deletes every
    server it holds, spot and guaranteed, and creates nothing until --cancel.

    The intent is kept in fleet state, so it survives restarts and holds on every
    replica. The running `sco run` does the work; this command waits and reports."""
    from sco.apps.wiring import open_store

    settings = _settings(config, {"state.url": _state(state)})
    limit_s = parse_duration(timeout, "--timeout")
    with _start_errors():
        store = open_store(settings)
    try:
        names = {p.name for p in settings.partitions}
        if names and partition not in names:
            raise BadInput(f"partition {partition!r} is not in the configuration")
        if cancel:
            dropped = store.drop_intent(partition)
            click.echo(
                f"{partition}: back in service" if dropped else f"{partition}: was not handed back"
            )
            return
        store.put_intent(partition, "handback", time.time(), _who())
        click.echo(f"{partition}: handback recorded; the partition's leader drains it now")
        if wait:
            _wait_empty(store, partition, limit_s)
    finally:
        store.close()


def _who() -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def _wait_empty(store: Any, partition: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    last = None
    while True:
        held = list(store.instances(partition))
        summary = ", ".join(
            f"{n} {s}" for s, n in sorted(Counter(str(i.state) for i in held).items())
        )
        if summary != last:
            click.echo(f"{partition}: holds {summary or 'nothing'}")
            last = summary
        if not held:
            return
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"{partition}: still holds {summary} after {limit_s:.0f}s (is `sco run` running?)"
            )
        time.sleep(2.0)


@click.group("config")
def config_group() -> None:
    """The configuration file (sco.yaml)."""


@config_group.command("check")
@click.argument("file", type=click.Path(path_type=Path))
def config_check(file: Path) -> None:
    """Validate FILE (under the SCO_* environment) and print it resolved, secrets masked."""
    settings = _settings(file, {})
    click.echo(yaml.safe_dump(masked(settings), sort_keys=False), nl=False)
    click.echo(f"{file}: ok", err=True)


@config_group.command("reference")
@click.option(
    "--into",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rewrite what follows the generated-reference marker in this file "
    "(docs/configuration.md) instead of printing.",
)
def config_reference(into: Path | None) -> None:
    """Print every key of sco.yaml as Markdown tables: type, default and meaning, read
    from the settings model itself."""
    from sco.apps.reference import reference, write_into

    if into is None:
        click.echo(reference(), nl=False)
        return
    try:
        changed = write_into(into)
    except ValueError as e:
        raise BadInput(str(e)) from None
    click.echo(f"{into}: {'updated' if changed else 'already current'}", err=True)


@config_group.command("migrate")
@config_option
def config_migrate(config: Path | None) -> None:
    """Bring the fleet-state database (`state.url`) to this version's schema and exit:
    the step before a rolling upgrade (the chart runs it as a pre-upgrade hook).
    Every process also migrates at start; with PostgreSQL, one at a time."""
    from sqlalchemy import text

    settings = _settings(config, {})
    with _start_errors():
        store = open_store(settings)
    try:
        with store.engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        store.close()
    click.echo(f"{mask_url(settings.state.url)}: schema at revision {revision}")


@click.group("slurm")
def slurm_group() -> None:
    """Slurm partitions (demand: slurm)."""


@slurm_group.command("conf")
@config_option
@click.argument("partition")
def slurm_conf(config: Path | None, partition: str) -> None:
    """The slurm.conf lines PARTITION's dynamic nodes need: a NodeSet on its feature,
    the Slurm partitions taking it, and a FUTURE placeholder per capacity class (with
    its pools' features) so jobs may ask for a class before such a node exists."""
    from sco.adapters.slurm.nodes import slurm_conf_lines

    settings = _settings(config, {})
    found = [p for p in settings.partitions if p.name == partition and p.slurm is not None]
    if not found:
        slurm = [p.name for p in settings.partitions if p.slurm is not None]
        raise BadInput(
            f"no partition {partition!r} with demand slurm (those: {', '.join(slurm) or 'none'})"
        )
    s = found[0].slurm
    assert s is not None
    pools: list[tuple[str, str]] = []
    if settings.provider.region_file is not None:
        from sco.adapters.openstack.config import RegionFileError, load_region

        try:
            region = load_region(settings.provider.region_file)
        except RegionFileError as e:
            raise BadInput(f"provider.region_file: {e}") from None
        pools = [
            (str(p.capacity_class), p.id)
            for p in region.domain_pools()
            if not found[0].flavors or p.flavor in found[0].flavors
        ]
    gres = ",".join(f"{g}:{n}" for g, n in sorted(s.gres.items()))
    click.echo(f"# sco partition {partition}: dynamic nodes (Slurm >= 22.05), see README")
    click.echo("# Room for every node at once, with some to spare while nodes come and go.")
    click.echo(f"MaxNodeCount={max(64, found[0].max_units * 2)}")
    if gres:
        click.echo(f"GresTypes={','.join(sorted(s.gres))}")
    lines = slurm_conf_lines(
        partition, s.partitions, s.cpus, s.memory_mb, pools, gres, settings.installation
    )
    for line in lines:
        click.echo(line)


@slurm_group.command("usage")
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--since", default="24h", show_default=True, help="How far back, e.g. 7d.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.argument("partition")
def slurm_usage(
    config: Path | None, state: str | None, since: str, as_json: bool, partition: str
) -> None:
    """Node-hours PARTITION's jobs used by capacity class (spot, guaranteed), read
    from Slurm's accounting (sacct; needs slurmdbd) and sco's fleet state."""
    from sco.adapters.slurm.nodes import node_name
    from sco.adapters.slurm.tools import ClusterTools, SlurmBadOutput, SlurmError, SlurmTools
    from sco.adapters.slurm.usage import node_hours
    from sco.apps.wiring import open_store

    settings = _settings(config, {"state.url": _state(state)})
    found = [p for p in settings.partitions if p.name == partition and p.slurm is not None]
    if not found or found[0].slurm is None:
        raise BadInput(f"no partition {partition!r} with demand slurm")
    s = found[0].slurm
    c = settings.slurm[s.cluster]
    tools = SlurmTools(ClusterTools(s.cluster, c.conf, c.bin_dir, max(c.timeout_s, 60.0)))
    until = time.time()
    start = until - parse_duration(since, "--since")
    with _start_errors():
        store = open_store(settings, run_migrations=False)
    try:
        classes = {node_name(sid): cls for sid, cls in store.server_classes(partition).items()}
    finally:
        store.close()
    try:
        runs = tools.allocations(s.partitions, start, until)
        usage = node_hours(runs, classes, start, until, tools.hostnames)
    except (SlurmError, SlurmBadOutput) as e:
        raise BadInput(
            f"slurm cluster {s.cluster}: {e} (node-hours need Slurm accounting: slurmdbd)"
        ) from None
    if as_json:
        click.echo(json.dumps({"partition": partition, **usage.as_dict()}, sort_keys=True))
        return
    click.echo(f"{partition}: node-hours of its jobs over the last {since}")
    for cls, hours in sorted(usage.node_hours.items()):
        click.echo(f"  {cls:<12} {hours:10.2f} node-h  {usage.runs[cls]:6d} job runs")
    if not usage.node_hours:
        click.echo("  (no job ran)")


# ---------------------------------------------------------------- sco distributor


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
    from sco.apps.wiring import open_store

    settings = _settings(
        config, {"state.url": _state(state), "distributor.bind": bind, "distributor.port": port}
    )
    d = settings.distributor
    logs.setup("distributor", settings.log.level, settings.log.format)
    with _start_errors():
        store = open_store(settings)
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
        engine=store.engine,
    )
    try:
        uvicorn.run(
            app,
            host=d.bind,
            port=d.port,
            ssl_certfile=str(d.tls_cert) if d.tls_cert else None,
            ssl_keyfile=str(d.tls_key) if d.tls_key else None,
            log_config=None,
            access_log=False,  # a line per long poll is noise; /metrics counts them
            timeout_graceful_shutdown=5,
            # Agents poll again within a long poll's wait: keep their connections.
            timeout_keep_alive=75,
            backlog=4096,
        )
    finally:
        store.close()


@click.command()
@click.option(
    "--distributor",
    "url",
    required=True,
    envvar="SCO_AGENT_DISTRIBUTOR",
    help="The distributor's URL, e.g. https://sco-distributor:8443.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="A file holding this node's token.",
)
@click.option(
    "--metadata-url",
    default=None,
    help="Read the token from OpenStack metadata instead, e.g. "
    "http://169.254.169.254/openstack/latest/meta_data.json.",
)
@click.option(
    "--drain-command",
    default=None,
    help="Run when the node must leave, with SCO_DRAIN_BY (Unix time), "
    "SCO_DRAIN_BY_ISO, SCO_INSTANCE_ID, SCO_PARTITION in its environment; "
    "exit 0 once the node is out of its scheduler.",
)
@click.option(
    "--slurm-node",
    default=None,
    help="Instead of a command: drain this Slurm node (DRAIN with the deadline in its "
    "reason; on a reclaim, requeue what would not end in time).",
)
@click.option(
    "--slurm-conf", type=click.Path(path_type=Path), default=None, help="SLURM_CONF for it."
)
@click.option(
    "--requeue-lead", default="30s", show_default=True,
    help="With --slurm-node: requeue this long before drain_by.",
)  # fmt: skip
@click.option(
    "--state-file",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/sco/agent.json"),
    show_default=True,
    help="The last contract and what was done, kept across restarts.",
)
@click.option(
    "--wait", "wait_s", type=float, default=30.0, show_default=True, help="Long-poll seconds."
)
@click.option(
    "--drain-lead",
    default=None,
    help="Start draining this long before drain_by (e.g. 5m: the node serves while its "
    "replacement boots); default: at once.",
)
@click.option(
    "--ca-file",
    type=click.Path(path_type=Path),
    default=None,
    help="CA bundle that signed the distributor's certificate.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def agent(
    url: str,
    token_file: Path | None,
    metadata_url: str | None,
    drain_command: str | None,
    slurm_node: str | None,
    slurm_conf: Path | None,
    requeue_lead: str,
    state_file: Path,
    wait_s: float,
    drain_lead: str | None,
    ca_file: Path | None,
    log_level: str,
) -> None:
    """The node agent: follow this node's contract and leave before drain_by."""
    import signal
    import threading

    try:
        from sco.agent import Agent, AgentConfig, AgentError
    except ModuleNotFoundError as e:
        raise BadInput(f"{e.name} is not installed (pip install 'sco[agent]')") from None
    from sco.apps import logs

    if (token_file is None) == (metadata_url is None):
        raise BadInput("give one of --token-file and --metadata-url")
    if (drain_command is None) == (slurm_node is None):
        raise BadInput("give one of --drain-command and --slurm-node")
    drainer = None
    if slurm_node is not None:
        from sco.adapters.slurm.drain import SlurmDrain
        from sco.adapters.slurm.tools import ClusterTools, SlurmTools

        tools = SlurmTools(ClusterTools("local", slurm_conf))
        lead = parse_duration(requeue_lead, "--requeue-lead")
        drainer = SlurmDrain(tools, slurm_node, lead, time.time, time.sleep)
    logs.setup("agent", log_level, "text")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = AgentConfig(
        distributor=url, state_file=state_file, drain_command=drain_command or "",
        token_file=token_file, metadata_url=metadata_url, wait_s=wait_s, ca_file=ca_file,
        drain_lead_s=parse_duration(drain_lead, "--drain-lead") if drain_lead else None,
    )  # fmt: skip
    try:
        Agent(config, drainer=drainer).run_until(stop)
    except AgentError as e:
        raise BadInput(str(e)) from None


@click.group("tokens")
def tokens_group() -> None:
    """Node tokens (partitions with agents: true)."""


@tokens_group.command("rotate")
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--instance", "instance_id", default=None, help="Only this instance's token.")
@click.argument("partition")
def tokens_rotate(
    config: Path | None, state: str | None, instance_id: str | None, partition: str
) -> None:
    """Revoke PARTITION's node tokens (or one instance's): they stop working at once,
    and the partition's leader hands each server a new one on its next cycle; agents
    read their token again when refused."""
    from sco.apps.wiring import open_store

    settings = _settings(config, {"state.url": _state(state)})
    with _start_errors():
        store = open_store(settings)
    try:
        n = store.contracts.revoke(partition, instance_id)
    finally:
        store.close()
    if instance_id is not None and n == 0:
        raise BadInput(f"no contract of instance {instance_id!r} in partition {partition!r}")
    click.echo(f"{partition}: {n} tokens revoked; new ones are issued on the next cycle")


# ---------------------------------------------------------------- sco reclaim


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state, to spare serving nodes (state.url).")
@click.option("--hall", default=None, help="The hall whose capacity is wanted back.")
@click.option("--flavor", default=None, help="The flavor whose capacity is wanted back.")
@click.option("--count", type=int, default=None, help="How many servers' worth.")
@click.option("--notice", "notice", default="120s", show_default=True, help="Notice given.")
@click.option(
    "--max-noticed",
    type=int,
    default=None,
    help="Disruption budget: servers of one partition (all its halls and flavors) "
    "under notice at once.",
)
@click.option(
    "--max-fraction",
    type=float,
    default=None,
    help="Disruption budget: fraction of a partition's servers (all its halls, "
    "flavors and classes) under notice at once.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Stay until the deadline and delete what is still there.",
)
@click.option(
    "--sweep",
    "sweep_only",
    is_flag=True,
    help="Only delete servers whose notice has run out (e.g. from cron).",
)
@click.option(
    "--trace",
    "trace_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Replay this capacity trace folder onto the cloud as reclaims.",
)
@click.option(
    "--map",
    "maps",
    multiple=True,
    metavar="SERIES=HALL/FLAVOR",
    help="With --trace: which spot pool a trace series plays (repeat).",
)
@click.option(
    "--speed",
    type=float,
    default=1.0,
    show_default=True,
    help="With --trace: trace seconds per second.",
)
@click.option(
    "--pool-size",
    type=int,
    default=None,
    help="With --trace: instances per trace unit (default: the trace's pool_size "
    "for 0/1 traces, 1 for counts).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def reclaim(
    config: Path | None, state: str | None, hall: str | None, flavor: str | None,
    count: int | None, notice: str, max_noticed: int | None, max_fraction: float | None,
    wait: bool, sweep_only: bool, trace_dir: Path | None, maps: tuple[str, ...],
    speed: float, pool_size: int | None, as_json: bool,
) -> None:  # fmt: skip
    """Take spot capacity back with notice, as a cloud operator would: choose the
    servers of HALL/FLAVOR by least harm within a disruption budget, set their
    `sco:reclaim-at`, and delete them at the deadline."""
    from sco.apps import logs
    from sco.apps.run import scope_warning, start_openstack
    from sco.apps.wiring import require
    from sco.decide.reclaim import Budget
    from sco.runtime.clock import SystemClock
    from sco.runtime.reclaimer import Reclaimer

    settings = _settings(config, {"state.url": _state(state)})
    replaying = trace_dir is not None
    if not (sweep_only or replaying) and (
        hall is None or flavor is None or count is None or count < 1
    ):
        raise BadInput("give --hall, --flavor and --count (>= 1), --trace, or --sweep")
    plays = _trace_pools(trace_dir, maps, pool_size) if trace_dir is not None else None
    if speed <= 0:
        raise BadInput("--speed: more than 0")
    if max_fraction is not None and not 0 < max_fraction <= 1:
        raise BadInput("--max-fraction: between 0 and 1")
    notice_s = parse_duration(notice, "--notice")
    # The sweep reports what it leaves alone (an unreadable notice) in the log.
    logs.setup("reclaim", settings.log.level, settings.log.format)
    with _start_errors():
        require(settings, "provider.cloud", "provider.region_file")
        provider = start_openstack(settings.provider, creates=False)
        store = open_store(settings, run_migrations=False) if state or config else None
    if warning := scope_warning(provider):
        click.echo(f"warning: {warning}", err=True)
    clock = SystemClock()
    reclaimer = Reclaimer(provider, clock, store)
    try:
        deleted = reclaimer.sweep()
        if sweep_only:
            _say(
                as_json,
                {"deleted": deleted, "foreign": provider.foreign()},
                f"deleted {len(deleted)} servers past their notice" + _foreign_note(provider),
            )
            return
        if plays is not None:
            _replay(reclaimer, plays, speed, notice_s, Budget(max_noticed, max_fraction), as_json)
            return
        assert hall is not None
        assert flavor is not None
        assert count is not None
        try:
            done = reclaimer.request(
                hall, flavor, count, notice_s, Budget(max_noticed, max_fraction)
            )
        except ValueError as e:
            raise BadInput(str(e)) from None
        for v in done.choice.victims:
            if not as_json:
                click.echo(f"{v.server_id} ({v.partition}): {v.why}")
        if not as_json:
            click.echo(
                f"noticed {len(done.choice.victims) - len(done.failed)} of {count}, "
                f"deadline in {notice_s:.0f} s; short {done.choice.short}"
                + (
                    f" (budget held back {dict(done.choice.held_back)})"
                    if done.choice.held_back
                    else ""
                )
            )
        gone: list[str] = []
        if wait and done.choice.victims:
            time.sleep(max(0.0, done.deadline - clock.now()) + 0.5)
            gone = reclaimer.sweep()
            if not as_json:
                click.echo(f"deleted {len(gone)} at the deadline")
        noticed = [v.server_id for v in done.choice.victims if v.server_id not in done.failed]
        if as_json:
            click.echo(json.dumps({
                "noticed": noticed,
                "why": {v.server_id: v.why for v in done.choice.victims},
                "failed": list(done.failed), "short": done.choice.short,
                "held_back": dict(done.choice.held_back), "deadline": done.deadline,
                "deleted": deleted + gone, "foreign": provider.foreign(),
            }, sort_keys=True))  # fmt: skip
        elif provider.foreign():
            click.echo(_foreign_note(provider).strip("; "))
    finally:
        if store is not None:
            store.close()


def _foreign_note(provider: Any) -> str:
    """The servers of other projects the reclaimer saw and left alone, if any."""
    counts = provider.foreign_servers()
    if not counts:
        return ""
    by = ", ".join(f"{n} in {p}" for p, n in sorted(counts.items()))
    return f"; left alone {sum(counts.values())} servers outside sco's projects ({by})"


def _trace_pools(
    folder: Path, maps: tuple[str, ...], pool_size: int | None
) -> tuple[list[Any], int]:
    """The trace's series, each on the spot pool `--map` names, and the pool size."""
    from sco.adapters.sim.traces import TraceError, load_traces
    from sco.runtime.reclaimer import ReplayPool

    try:
        traces = load_traces(folder)
    except (TraceError, OSError) as e:
        raise BadInput(f"--trace: {e}") from None
    by_name = {s.name: s for s in traces.series}
    if not maps:
        raise BadInput(f"--trace needs --map SERIES=HALL/FLAVOR (series: {', '.join(by_name)})")
    pools = []
    for m in maps:
        name, _, where = m.partition("=")
        hall, _, flavor = where.partition("/")
        if name not in by_name or not hall or not flavor:
            raise BadInput(
                f"--map {m!r}: SERIES=HALL/FLAVOR with SERIES one of {', '.join(by_name)}"
            )
        pools.append(ReplayPool(by_name[name], hall, flavor))
    binary = all(p.series.binary for p in pools)
    size = pool_size if pool_size is not None else (traces.region.pool_size if binary else 1)
    if size < 1:
        raise BadInput("--pool-size: at least 1")
    return pools, size


def _replay(
    reclaimer: Any, plays: tuple[list[Any], int], speed: float, notice_s: float,
    budget: Any, as_json: bool,
) -> None:  # fmt: skip
    import signal
    import threading

    from sco.runtime.reclaimer import replay

    pools, size = plays
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def told(t: float, p: Any, done: Any) -> None:
        ids = [v.server_id for v in done.choice.victims if v.server_id not in done.failed]
        doc = {"trace_s": round(t, 1), "hall": p.hall, "flavor": p.flavor, "noticed": ids,
               "short": done.choice.short, "deadline": done.deadline}  # fmt: skip
        _say(as_json, doc, f"trace {t:.0f} s: {p.hall}/{p.flavor}: noticed {len(ids)}"
             + (f", short {done.choice.short}" if done.choice.short else ""))  # fmt: skip

    n = replay(
        reclaimer, pools, pool_size=size, speed=speed, notice_s=notice_s, budget=budget,
        stop=stop.is_set, sleep=stop.wait, on_notice=told,
    )  # fmt: skip
    _say(as_json, {"noticed_total": n}, f"trace replayed: {n} servers noticed")


def _say(as_json: bool, doc: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(doc, sort_keys=True) if as_json else text)


def _join_of(p: Any) -> str:
    """How a partition's nodes join their scheduler, as the contract says it."""
    if p.slurm is not None:
        return f"slurm:{p.slurm.cluster}"
    return str(p.kind)


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--bind", default=None, help="Address to listen on (http.bind).")
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
    from sco.apps import logs
    from sco.runtime.clock import SystemClock

    settings = _settings(
        config, {"state.url": _state(state), "http.bind": bind, "http.status_port": port}
    )
    logs.setup("status", settings.log.level, settings.log.format)
    with _start_errors():
        store = open_store(settings)
    try:
        uvicorn.run(
            create_app(store, SystemClock().now),
            host=settings.http.bind,
            port=settings.http.status_port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    finally:
        store.close()


COMMANDS = (
    run,
    status,
    watch,
    score,
    history,
    explain,
    handback,
    config_group,
    slurm_group,
    distributor,
    agent,
    reclaim,
    tokens_group,
)
