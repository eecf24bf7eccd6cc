"""The `sco` command.

Errors in what the user gave (files, options) print one line naming the file
or option and the field, and exit with status 2 before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from sco.adapters.demandfile.intake import DemandFileError
from sco.adapters.sim.region import SimConfig
from sco.adapters.sim.traces import TraceError, load_traces
from sco.adapters.sqlstate.store import sqlite_url
from sco.apps.common import EXIT_BAD_INPUT, BadInput, parse_duration, state_url
from sco.apps.common import console as make_console
from sco.apps.control import COMMANDS, config_option
from sco.apps.lab import lab_group
from sco.apps.settings import load
from sco.decide.policies import POLICIES, UnknownPolicy
from sco.runtime.accounting import PartitionMetrics
from sco.runtime.evaluation import (
    Capacity,
    EvalConfig,
    evaluate_named,
    factory,
    suite,
    window_starts,
)
from sco.runtime.fleet import FLEET
from sco.runtime.simulation import (
    Simulation,
    SimulationInputError,
    SimulationResult,
    SimulationSpec,
)


def bundled(*parts: str) -> Path:
    """A path inside the installed package's data folder."""
    return Path(str(resources.files("sco").joinpath("data", *parts)))


@contextmanager
def _input_errors() -> Iterator[None]:
    try:
        yield
    except (TraceError, DemandFileError, SimulationInputError, ValueError) as e:
        raise BadInput(str(e)) from None
    except UnknownPolicy as e:
        raise BadInput(f"--policy: {e}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """sco: harvest idle OpenStack capacity as spot instances for Kubernetes and Slurm."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
def policies() -> None:
    """List the placement policies known by name."""
    for name in sorted(POLICIES):
        click.echo(name)


@cli.command()
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
    with _input_errors():
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


@cli.command()
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
    help="SQLite fleet-state file to keep (default: a temporary one).",
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
    with _input_errors(), tempfile.TemporaryDirectory(prefix="sco-fleet-") as fleet_tmp:
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
    if state is None:
        with tempfile.TemporaryDirectory(prefix="sco-sim-") as tmp:
            result = _run(sim, Path(tmp) / "state.db", quiet=as_json)
    else:
        result = _run(sim, state, quiet=as_json)
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


DEFAULT_POLICIES = "optimal,sco,spothedge,round-robin,even-spread,cheapest,all-guaranteed"
FLEET_POLICIES = "optimal,sco,spothedge,cheapest,all-guaranteed"
FLEET_WINDOWS = 2


@cli.command()
@click.option("--suite", "suite_name", default=None, help="A named suite: spothedge, fleet.")
@click.option(
    "--trace",
    "traces",
    type=click.Path(path_type=Path),
    multiple=True,
    help="A folder of traces to run in the same setting (repeatable).",
)
@click.option(
    "--demand",
    type=click.Path(path_type=Path),
    default=None,
    help="With --trace: run whole simulations at fleet scale with this demand file.",
)
@click.option(
    "--pool-size",
    type=int,
    default=None,
    help="With --demand: instances one trace unit stands for (0/1 and count traces).",
)
@click.option(
    "--guaranteed-quota",
    type=int,
    default=None,
    help="With --demand: guaranteed instances per hall (default: the region file's).",
)
@click.option(
    "--policies",
    default=None,
    help=f"Columns [default: {DEFAULT_POLICIES}; at fleet scale {FLEET_POLICIES}].",
)
@click.option("--notice-s", type=float, default=0.0, show_default=True, help="Reclaim notice.")
@click.option(
    "--windows",
    type=int,
    default=None,
    help=f"24 h windows per trace [default: 10; at fleet scale {FLEET_WINDOWS}].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of window offsets.")
@click.option("--workers", type=int, default=2, show_default=True, help="Processes to use.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line of results.")
def evaluate(
    suite_name: str | None,
    traces: tuple[Path, ...],
    demand: Path | None,
    pool_size: int | None,
    guaranteed_quota: int | None,
    policies: str | None,
    notice_s: float,
    windows: int | None,
    seed: int,
    workers: int,
    as_json: bool,
) -> None:
    """Policies side by side on the same traces and windows.

    The spothedge suite and plain --trace runs replay the SkyServe setting (one
    service of 3 replicas). The fleet suite and --trace with --demand run whole
    simulations (controllers, fleet state, scorer, watcher) at thousands of
    instances; there `optimal` is the LP bound of the omniscient schedule."""
    fleet = suite_name == "fleet" or demand is not None
    chosen = policies if policies is not None else (FLEET_POLICIES if fleet else DEFAULT_POLICIES)
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    if not names:
        raise BadInput("--policies: name at least one policy")
    if not suite_name and not traces:
        raise BadInput("give --suite spothedge|fleet or --trace DIR")
    if workers < 1:
        raise BadInput(f"--workers: must be >= 1, got {workers}")
    if (pool_size is not None or guaranteed_quota is not None) and demand is None:
        raise BadInput("--pool-size and --guaranteed-quota go with --demand")
    for flag, v in (("--pool-size", pool_size), ("--guaranteed-quota", guaranteed_quota)):
        if v is not None and v < 1:
            raise BadInput(f"{flag}: must be >= 1, got {v}")
    if fleet:
        _evaluate_fleet(
            suite_name,
            traces,
            demand,
            (pool_size, guaranteed_quota),
            names,
            notice_s,
            FLEET_WINDOWS if windows is None else windows,
            seed,
            workers,
            as_json,
        )
        return
    with _input_errors():
        for name in names:
            factory(name)
        cfg = EvalConfig(notice_s=notice_s, windows=10 if windows is None else windows, seed=seed)
        sets = suite(suite_name, bundled("traces", "apache")) if suite_name else []
        sets += [Capacity.of(t.name, load_traces(t)) for t in traces]
        for c in sets:
            window_starts(c, cfg)  # every trace long enough, before any work
    console = make_console(stderr=as_json)
    results: dict[str, dict[str, dict[str, float]]] = {}
    wall0 = time.perf_counter()
    for c in sets:
        res = evaluate_named(c, cfg, names, workers, _eval_progress)
        results[c.name] = {n: r.as_dict() for n, r in res.items()}
    title = (
        f"sco evaluate — target {cfg.target}, {cfg.windows} x {cfg.window_s / 3600:.0f} h "
        f"windows, notice {cfg.notice_s:.0f} s, {time.perf_counter() - wall0:.0f} s"
    )
    _print_evaluation(console, results, title)
    if as_json:
        setting = {
            "target": cfg.target,
            "od_ratio": cfg.od_ratio,
            "cold_start_s": cfg.cold_start_s,
            "tick_s": cfg.tick_s,
            "window_s": cfg.window_s,
            "windows": cfg.windows,
            "seed": cfg.seed,
            "notice_s": cfg.notice_s,
        }
        click.echo(json.dumps({"setting": setting, "traces": results}, sort_keys=True))


def _evaluate_fleet(
    suite_name: str | None,
    traces: tuple[Path, ...],
    demand: Path | None,
    scale: tuple[int | None, int | None],
    names: list[str],
    notice_s: float,
    windows: int,
    seed: int,
    workers: int,
    as_json: bool,
) -> None:
    from sco.runtime.fleet_eval import DAY_S, RESYNC_S, custom_case, evaluate_fleet, fleet_suite

    if suite_name not in (None, "fleet"):
        raise BadInput(f"--suite: {suite_name} does not take --demand")
    if traces and demand is None:
        raise BadInput("--suite fleet with --trace needs --demand FILE")
    if windows < 1:
        raise BadInput(f"--windows: must be >= 1, got {windows}")
    if notice_s < 0:
        raise BadInput(f"--notice-s: must be >= 0, got {notice_s}")
    console = make_console(stderr=as_json)
    wall0 = time.perf_counter()
    # The suite's demand files live as long as its runs; every input is checked
    # before the first run.
    with _input_errors(), tempfile.TemporaryDirectory(prefix="sco-fleet-demand-") as tmp:
        cases = fleet_suite(Path(tmp), bundled("traces")) if suite_name == "fleet" else []
        if demand is not None:
            cases += [custom_case(t, demand, *scale) for t in traces]
        results = evaluate_fleet(
            cases,
            names,
            windows=windows,
            seed=seed,
            notice_s=notice_s,
            workers=workers,
            progress=_eval_progress,
        )
    title = (
        f"sco evaluate — fleet, {windows} x 24 h windows, notice {notice_s:.0f} s, "
        f"{time.perf_counter() - wall0:.0f} s"
    )
    _print_evaluation(console, results, title)
    if as_json:
        setting = {
            "scale": "fleet",
            "window_s": DAY_S,
            "windows": windows,
            "seed": seed,
            "notice_s": notice_s,
            "cycle_s": 30.0,
            "idle_resync_s": RESYNC_S,
            "scenarios": {
                c.name: {
                    "traces": str(c.traces),
                    "pool_size": c.sim.pool_size,
                    "guaranteed_quota_per_hall": c.sim.guaranteed_quota_per_hall,
                }
                for c in cases
            },
        }
        click.echo(json.dumps({"setting": setting, "traces": results}, sort_keys=True))


def _eval_progress(trace: str, done: int, total: int) -> None:
    if done == total or done % max(1, total // 5) == 0:
        click.echo(f"{trace}: {done}/{total} window runs", err=True)


def _print_evaluation(
    console: Console, results: dict[str, dict[str, dict[str, float]]], title: str
) -> None:
    table = Table(title=title)
    for col in (
        "trace",
        "policy",
        "availability",
        "floor avail.",
        "served",
        "cost vs guar.",
        "reclaims",
        "guar. share",
    ):
        table.add_column(col, justify="left" if col in ("trace", "policy") else "right")
    for trace, by_policy in results.items():
        for name, m in by_policy.items():
            table.add_row(
                trace,
                name,
                f"{m['availability']:.4f}",
                f"{m['floor_availability']:.4f}",
                f"{m['served_fraction']:.4f}",
                f"{m['cost_vs_guaranteed']:.3f}",
                f"{m['reclaims']:.1f}",
                f"{m['guaranteed_share']:.3f}",
            )
        table.add_section()
    console.print(table)


@cli.command()
@config_option
@click.option("--state", default=None, help="Fleet state: a SQLite file or a URL (state.url).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def pools(config: Path | None, state: str | None, as_json: bool) -> None:
    """The pools ranked by their latest scores, why, and their exclusions."""
    from sco.apps.pools import PoolRow, load_rows, render

    with _input_errors():  # a SettingsError is a ValueError: one line, exit 2
        url, where = (
            (state_url(state), "--state") if state else (load(config).state.url, "state.url")
        )
        rows: list[PoolRow] = load_rows(url, where)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], sort_keys=True))
    else:
        render(make_console(stderr=False), rows)


def _run(sim: Simulation, state_path: Path, quiet: bool) -> SimulationResult:
    state_path.parent.mkdir(parents=True, exist_ok=True)
    with _progress(quiet) as progress:
        return sim.run(sqlite_url(state_path), progress=progress)


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


for _command in COMMANDS:
    cli.add_command(_command)
cli.add_command(lab_group)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        click.echo(f"sco: error: {e.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.ClickException as e:
        click.echo(f"sco: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("sco: aborted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
