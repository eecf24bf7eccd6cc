"""The lab's runs on the simulated region: `sco policies`, `sco demo` and `sco simulate`."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from sco.apps.common import BadInput, bundled, parse_duration
from sco.apps.common import console as make_console
from sco.assembly.lab import (
    FLEET,
    INPUT_ERRORS,
    PartitionMetrics,
    SimConfig,
    Simulation,
    SimulationResult,
    SimulationSpec,
)
from sco.assembly.state import sqlite_url
from sco.decide.policies import POLICIES, UnknownPolicy


@contextmanager
def input_errors() -> Iterator[None]:
    try:
        yield
    except INPUT_ERRORS as e:
        raise BadInput(str(e)) from None
    except UnknownPolicy as e:
        raise BadInput(f"--policy: {e}") from None


@click.command()
def policies() -> None:
    """List the placement policies known by name."""
    for name in sorted(POLICIES):
        click.echo(name)


@click.command()
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Report folder (default: reports/demo-<time>).",
)
@click.option(
    "--days",
    type=float,
    default=None,
    help="Simulate only this many days (default: the whole 45-day trace).",
)
@click.option(
    "--history",
    default=None,
    help="Pool history DSN (default: chdb://<report folder>/history, embedded).",
)
def demo(out: Path | None, days: float | None, history: str | None) -> None:
    """Two clusters on a region simulated from the bundled 9-zone V100 trace."""
    folder = out or Path("reports") / f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    spec = SimulationSpec(
        traces=bundled("traces", "apache", "v100-9zone"),
        demand=bundled("demand", "demo.yaml"),
        policy="sco",
        duration_s=days * 86400 if days else None,
        cycle_s=60.0,
        idle_resync_s=300.0,
        history_dsn=history or f"chdb://{folder.resolve() / 'history'}",
    )
    with input_errors():
        sim = Simulation.build(spec)
    console = make_console(stderr=False)
    console.print(
        f"[bold]sco demo[/]: {len(list(sim.demand.partitions()))} partitions on "
        f"{len(sim.traces.series)} spot pools from {spec.traces.name}, "
        f"{(sim.end_s - sim.start_s) / 86400:.1f} simulated days"
    )
    result = _run(sim, folder / "state.db", quiet=False)
    _print_summary(console, result)
    _print_signals(console, result)
    console.print(f"pool ranking: sco pools --state {folder / 'state.db'}")
    first = next(iter(sim.demand.partitions())).name
    console.print(f"a plan and its reasons: sco explain --state {folder / 'state.db'} {first}")
    path = _write_report(result, folder)
    console.print(f"report: {path}")


@click.command()
@click.option(
    "--traces",
    "traces",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of traces (CSV date,availability or JSON with gap_seconds).",
)
@click.option(
    "--fleet",
    type=click.Choice(sorted(FLEET)),
    default=None,
    help="Instead of --traces: a fleet scenario (a bundled trace at scale, four "
    "partitions of about 5,000 instances, ample guaranteed quota).",
)
@click.option(
    "--demand",
    type=click.Path(path_type=Path),
    default=None,
    help="Demand file (YAML). Default: one service wanting 3 units, floor 3.",
)
@click.option("--policy", default="sco", show_default=True, help="Placement policy by name.")
@click.option("--duration", default=None, help="How long to simulate: 90s, 30m, 12h, 7d.")
@click.option(
    "--start-offset", default="0", show_default=True, help="Start this far into the traces."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for faults.")
@click.option(
    "--cycle-s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between controller cycles.",
)
@click.option(
    "--cold-start-s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds from create to a running server.",
)
@click.option(
    "--notice-s",
    type=float,
    default=0.0,
    show_default=True,
    help="Reclaim notice lead time in seconds (0: no notice).",
)
@click.option(
    "--pool-size",
    type=int,
    default=None,
    help="Instances a 1 stands for in 0/1 traces (default: region.yaml, else 8), and "
    "a unit of a count trace (default: 1). Scales a trace to a fleet.",
)
@click.option(
    "--error-rate",
    type=float,
    default=0.0,
    show_default=True,
    help="Chance that a provider call fails with a retryable error.",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    default=None,
    help="Write an HTML report to this folder.",
)
@click.option(
    "--state",
    type=click.Path(path_type=Path),
    default=None,
    help="A new SQLite file to keep the end state in, for sco explain, pools and status "
    "(the run itself keeps fleet state in memory).",
)
@click.option(
    "--fleet-state",
    type=click.Choice(["memory", "sqlite"]),
    default="memory",
    show_default=True,
    help="What the run keeps fleet state in: the in-memory twins, or SQLite all along "
    "(the SQL path; in the --state file if given). Both are held to one conformance "
    "suite and give the same results.",
)
@click.option(
    "--idle-resync-s",
    type=float,
    default=None,
    help="Event-driven controllers: skip idle cycles, but cycle at least this often "
    "(default: every cycle).",
)
@click.option(
    "--history",
    default=None,
    help="Also keep pool history here: chdb:///path or http://clickhouse:8123.",
)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line of results.")
def simulate(
    traces: Path | None,
    fleet: str | None,
    demand: Path | None,
    policy: str,
    duration: str | None,
    start_offset: str,
    seed: int,
    cycle_s: float,
    cold_start_s: float,
    notice_s: float,
    pool_size: int | None,
    error_rate: float,
    report: Path | None,
    state: Path | None,
    fleet_state: str,
    idle_resync_s: float | None,
    history: str | None,
    as_json: bool,
) -> None:
    """Run the controllers against a region simulated from a folder of traces."""
    if pool_size is not None and pool_size < 1:
        raise BadInput(f"--pool-size: must be >= 1, got {pool_size}")
    if (traces is None) == (fleet is None):
        raise BadInput("give one of --traces and --fleet")
    scenario = FLEET[fleet] if fleet is not None else None
    with input_errors(), tempfile.TemporaryDirectory(prefix="sco-fleet-") as fleet_tmp:
        if scenario is not None:
            traces = bundled("traces", *scenario.trace)
            demand = demand or scenario.write_demand(Path(fleet_tmp))
        assert traces is not None
        sim_cfg = scenario.sim_config(pool_size) if scenario else SimConfig(pool_size=pool_size)
        sim_cfg = dataclasses.replace(
            sim_cfg, cold_start_s=cold_start_s, notice_s=notice_s, error_rate=error_rate,
            seed=seed,
        )  # fmt: skip
        spec = SimulationSpec(
            traces=traces,
            demand=demand or bundled("demand", "default.yaml"),
            policy=policy,
            duration_s=parse_duration(duration, "--duration") if duration else None,
            start_offset_s=parse_duration(start_offset, "--start-offset"),
            seed=seed,
            cycle_s=cycle_s,
            sim=sim_cfg,
            idle_resync_s=idle_resync_s,
            history_dsn=history,
        )
        sim = Simulation.build(spec)
    console = make_console(stderr=as_json)
    result = _run(sim, state, quiet=as_json, on_sql=fleet_state == "sqlite")
    _print_summary(console, result)
    _print_signals(console, result)
    if report is not None:
        console.print(f"report: {_write_report(result, report)}")
    if as_json:
        line = {
            **result.aggregate(),
            "partitions": {n: m.as_dict() for n, m in result.partitions.items()},
        }
        click.echo(json.dumps(line, sort_keys=True))


def _print_signals(console: Console, result: SimulationResult) -> None:
    console.print(
        f"exclusions: {result.exclusions} (pools taken out or degraded by the watcher); "
        f"pool scoring runs: {result.scorings}"
    )
    if result.history_events is not None:
        console.print(f"pool history: {result.history_events} events in {result.spec.history_dsn}")


def _run(
    sim: Simulation, state_path: Path | None, quiet: bool, on_sql: bool = False
) -> SimulationResult:
    """Fleet state in memory (the twins); with `state_path`, copied at the end into
    that SQLite file for `sco explain`, `sco pools` and `sco status`. `on_sql`: in
    SQLite all along (`state_path`, else a scratch file)."""
    if state_path is not None:
        if state_path.exists() and state_path.stat().st_size:
            # Checked now, not after the run: its records would collide with the file's.
            raise BadInput(f"--state: {state_path} exists; a run writes a new file")
        state_path.parent.mkdir(parents=True, exist_ok=True)
    with _progress(quiet) as progress, tempfile.TemporaryDirectory(prefix="sco-sim-") as tmp:
        url = sqlite_url(state_path or Path(tmp) / "state.sqlite")
        if on_sql:
            return sim.run(state_url=url, progress=progress)
        copy_to = url if state_path is not None else None
        return sim.run(progress=progress, copy_to=copy_to)


@contextmanager
def _progress(quiet: bool) -> Iterator[Callable[[float], None] | None]:
    """A live bar on a terminal; a line every 10 % elsewhere (CI logs)."""
    if quiet:
        yield None
        return
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            "[progress.percentage]{task.percentage:>3.0f}%",
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task("simulating", total=1.0)
            yield lambda f: bar.update(task, completed=f)
        return
    shown = [-1]

    def step(f: float) -> None:
        tenth = int(f * 10)
        if tenth > shown[0]:
            shown[0] = tenth
            click.echo(f"simulated {tenth * 10}%", err=True)

    yield step


def _write_report(result: SimulationResult, folder: Path) -> Path:
    from sco.apps.report import write_report

    return write_report(result, folder)


def _pct(x: float) -> str:
    return f"{x:.2%}"


def _print_summary(console: Console, result: SimulationResult) -> None:
    table = Table(
        title=f"sco simulate — policy {result.spec.policy_name}, "
        f"{(result.end_s - result.start_s) / 3600:.1f} h simulated in "
        f"{result.wall_s:.1f} s"
    )
    for col in (
        "partition",
        "availability",
        "floor avail.",
        "served",
        "below floor",
        "cost vs guar.",
        "reclaims",
        "creates",
        "guar. share",
        "mean replace",
    ):
        table.add_column(col, justify="right" if col != "partition" else "left")
    for m in result.partitions.values():
        table.add_row(*_row(m))
    console.print(table)


def _row(m: PartitionMetrics) -> list[str]:
    replace = f"{m.mean_replace_s:.0f} s ({m.replaced})" if m.mean_replace_s is not None else "—"
    return [
        m.partition,
        _pct(m.availability),
        _pct(m.floor_availability),
        _pct(m.served_fraction),
        f"{m.below_floor_unit_h:.1f} unit-h",
        _pct(m.cost_vs_guaranteed),
        str(m.reclaims),
        str(m.creates),
        _pct(m.guaranteed_share),
        replace,
    ]
