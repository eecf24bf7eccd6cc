"""The operator's one-shot commands: `sco explain`, `sco handback`, `sco pools`,
`sco config`, `sco slurm conf|job-submit|usage` and `sco tokens rotate`."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import click
import yaml

from sco.apps.common import BadInput, console, parse_duration, state_url
from sco.apps.options import config_option, settings_of, start_errors, state_override
from sco.assembly.settings import load, mask_url, masked
from sco.assembly.state import open_fleet
from sco.assembly.wiring import StartError
from sco.domain.demand import HANDBACK
from sco.ports import InstanceStore


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.argument("partition")
def explain(config: Path | None, state: str | None, as_json: bool, partition: str) -> None:
    """The current plan of PARTITION, pool by pool, with the reasons behind each count."""
    from sco.apps.explain import NothingToExplain, render
    from sco.apps.explain import explain as load_explanation

    url = state_url(state) if state else settings_of(config, {}).state.url
    try:
        found = load_explanation(url, partition, time.time())
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
    settings = settings_of(config, {"state.url": state_override(state)})
    limit_s = parse_duration(timeout, "--timeout")
    with start_errors():
        store = open_fleet(settings)
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
        store.put_intent(partition, HANDBACK, time.time(), _who())
        click.echo(f"{partition}: handback recorded; the partition's leader drains it now")
        if wait:
            _wait_empty(store, partition, limit_s)
    finally:
        store.close()


def _who() -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def _wait_empty(store: InstanceStore, partition: str, limit_s: float) -> None:
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
    settings = settings_of(file, {})
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
    settings = settings_of(config, {})
    with start_errors():
        store = open_fleet(settings)
    try:
        revision = store.schema_revision()
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
    from sco.assembly.slurm import conf_lines

    settings = settings_of(config, {})
    with start_errors():
        lines = conf_lines(settings, partition)
    for line in lines:
        click.echo(line)


@slurm_group.command("job-submit")
@config_option
@click.option(
    "--default-partition",
    default=None,
    metavar="NAME",
    help="The cluster's default Slurm partition, when it is one of these: jobs that "
    "name no partition are kept in one pool too (else they are left alone).",
)
@click.argument("partitions", metavar="PARTITION...", nargs=-1, required=True)
def slurm_job_submit(
    config: Path | None, default_partition: str | None, partitions: tuple[str, ...]
) -> None:
    """The job_submit.lua that keeps each job of many nodes of PARTITION's Slurm
    partitions on nodes of one pool (a matching OR of its pools' features, in the
    region file's order). Name every sco partition of the cluster: one script serves
    it. Install it next to slurm.conf, with JobSubmitPlugins=lua (`sco slurm conf`)."""
    from sco.assembly.slurm import job_submit

    settings = settings_of(config, {})
    with start_errors():
        text = job_submit(settings, partitions, default_partition)
    click.echo(text, nl=False)


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
    from sco.assembly.slurm import usage

    settings = settings_of(config, {"state.url": state_override(state)})
    with start_errors():
        used = usage(settings, partition, parse_duration(since, "--since"))
    if as_json:
        click.echo(json.dumps({"partition": partition, **used.doc}, sort_keys=True))
        return
    click.echo(f"{partition}: node-hours of its jobs over the last {since}")
    for cls, hours in sorted(used.node_hours.items()):
        click.echo(f"  {cls:<12} {hours:10.2f} node-h  {used.runs[cls]:6d} job runs")
    if not used.node_hours:
        click.echo("  (no job ran)")


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
    settings = settings_of(config, {"state.url": state_override(state)})
    with start_errors():
        store = open_fleet(settings)
    try:
        n = store.contracts.revoke(partition, instance_id)
    finally:
        store.close()
    if instance_id is not None and n == 0:
        raise BadInput(f"no contract of instance {instance_id!r} in partition {partition!r}")
    click.echo(f"{partition}: {n} tokens revoked; new ones are issued on the next cycle")


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def pools(config: Path | None, state: str | None, as_json: bool) -> None:
    """The pools ranked by their latest scores, why, and their exclusions."""
    from sco.apps.pools import PoolRow, load_rows, render

    try:  # a SettingsError is a ValueError: one line, exit 2
        url, where = (
            (state_url(state), "--state") if state else (load(config).state.url, "state.url")
        )
        rows: list[PoolRow] = load_rows(url, where)
    except (ValueError, StartError) as e:
        raise BadInput(str(e)) from None
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], sort_keys=True))
    else:
        render(console(stderr=False), rows)
