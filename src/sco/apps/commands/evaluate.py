"""`sco evaluate`: policies side by side, on the paper's tick model or as whole
simulations at fleet scale."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from sco.apps.commands.simulate import input_errors
from sco.apps.common import BadInput, bundled, sweep_on, workers_options
from sco.apps.common import console as make_console
from sco.assembly.lab import (
    Capacity,
    EvalConfig,
    Workers,
    evaluate_all,
    factory,
    load_traces,
    suite,
    window_starts,
)

DEFAULT_POLICIES = "optimal,sco,spothedge,round-robin,even-spread,cheapest,all-guaranteed"
FLEET_POLICIES = "optimal,sco,spothedge,cheapest,all-guaranteed"
FLEET_WINDOWS = 2


@click.command()
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
@workers_options
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
    workers: int | None,
    cluster: str | None,
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
    if (pool_size is not None or guaranteed_quota is not None) and demand is None:
        raise BadInput("--pool-size and --guaranteed-quota go with --demand")
    for flag, v in (("--pool-size", pool_size), ("--guaranteed-quota", guaranteed_quota)):
        if v is not None and v < 1:
            raise BadInput(f"{flag}: must be >= 1, got {v}")
    if fleet:
        with sweep_on(workers, cluster) as where:
            _evaluate_fleet(
                suite_name,
                traces,
                demand,
                (pool_size, guaranteed_quota),
                names,
                notice_s,
                FLEET_WINDOWS if windows is None else windows,
                seed,
                where,
                as_json,
            )
        return
    with input_errors():
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
    with sweep_on(workers, cluster) as where:
        for trace, res in evaluate_all(sets, cfg, names, where, _eval_progress).items():
            results[trace] = {n: r.as_dict() for n, r in res.items()}
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
    workers: Workers,
    as_json: bool,
) -> None:
    from sco.assembly.lab import DAY_S, RESYNC_S, custom_case, evaluate_fleet, fleet_suite

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
    with input_errors(), tempfile.TemporaryDirectory(prefix="sco-fleet-demand-") as tmp:
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
    # The bound is not a run: it serves the target by construction, so only its cost
    # and guaranteed share are computed; the table does not print the rest as measured.
    _print_evaluation(console, results, title, bounds={"optimal"})
    if as_json:
        setting = {
            "scale": "fleet",
            "bounds": {"optimal": BOUND},
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


BOUND = (
    "the LP relaxation of the omniscient schedule, not a run: it serves the whole target by "
    "construction (availability, floor availability and served fraction 1, no reclaims); "
    "only its cost and guaranteed share are computed"
)
BY_CONSTRUCTION = ("availability", "floor_availability", "served_fraction", "reclaims")


def _print_evaluation(
    console: Console,
    results: dict[str, dict[str, dict[str, float]]],
    title: str,
    bounds: set[str] | frozenset[str] = frozenset(),
) -> None:
    """One row per trace and policy; a bound's by-construction figures are left out
    (`—`) rather than printed beside measured ones."""
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
            bound = name in bounds

            def cell(key: str, form: str, m: dict[str, float] = m, bound: bool = bound) -> str:
                return "—" if bound and key in BY_CONSTRUCTION else format(m[key], form)

            table.add_row(
                trace,
                f"{name} (bound)" if bound else name,
                cell("availability", ".4f"),
                cell("floor_availability", ".4f"),
                cell("served_fraction", ".4f"),
                cell("cost_vs_guaranteed", ".3f"),
                cell("reclaims", ".1f"),
                cell("guaranteed_share", ".3f"),
            )
        table.add_section()
    if bounds & {n for by_policy in results.values() for n in by_policy}:
        table.caption = f"{', '.join(sorted(bounds))}: {BOUND}"
    console.print(table)
