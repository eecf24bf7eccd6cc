"""`sco replay`: a batch workload on sco's capacity, beside the clusters a user would
otherwise run, in what the jobs' users feel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table

from sco.apps.commands.simulate import input_errors
from sco.apps.common import bundled, sweep_on, workers_options
from sco.apps.common import console as make_console
from sco.assembly.lab import REPLAY_POLICIES as POLICIES
from sco.assembly.lab import Replayed, ReplaySpec, replay

DEFAULT_POLICIES = "sco,spot-requeue,power-save-guaranteed,static-guaranteed"


@click.command("replay")
@click.option(
    "--workload",
    type=click.Path(path_type=Path),
    required=True,
    help="Batch jobs in the Standard Workload Format (.swf) of the Parallel Workloads Archive, "
    "or services and jobs of pods for a Kubernetes partition (.yaml; docs/replay.md).",
)
@click.option(
    "--trace",
    "traces",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of capacity traces (default: the bundled 9-zone V100 trace).",
)
@click.option("--pool-size", type=int, default=None, help="Instances one trace unit stands for.")
@click.option("--days", type=float, default=None, help="Replay the workload's first D days.")
@click.option(
    "--policies",
    default=DEFAULT_POLICIES,
    show_default=True,
    help=f"Comma-separated, of: {', '.join(POLICIES)}.",
)
@click.option(
    "--notice-s", type=float, default=120.0, show_default=True, help="The reclaim notice."
)
@click.option(
    "--checkpoint-s",
    type=float,
    default=None,
    help="Jobs checkpoint this often: a lost node loses only the work since (default: never).",
)
@click.option(
    "--procs-per-node",
    type=int,
    default=None,
    help="Processors of a node (default: the file's MaxProcs / MaxNodes, else 1).",
)
@click.option(
    "--max-nodes",
    type=int,
    default=None,
    help="The cluster's most nodes (default: the file's MaxNodes, else its widest job; "
    "for pods, the file's max_nodes, else its peak).",
)
@click.option(
    "--cycle-s", type=float, default=30.0, show_default=True, help="Seconds between cycles."
)
@click.option(
    "--requeue-lead-s",
    type=float,
    default=None,
    help="A reclaim's jobs are requeued this long before its deadline (default: a cycle + 30 s).",
)
@click.option(
    "--cold-start-s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds from a create to its server up (its node joins then).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the region's faults.")
@click.option(
    "--one-pool/--spread",
    "one_pool",
    default=None,
    help="Whether sco's policies keep each job of many nodes in one pool (slurm.one_pool "
    "and its job_submit.lua; default: only sco-no-notice does).",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write an HTML report with plots (and summary.json) into this folder.",
)
@workers_options
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line of results.")
def replay_command(
    workload: Path,
    traces: Path | None,
    pool_size: int | None,
    days: float | None,
    policies: str,
    notice_s: float,
    checkpoint_s: float | None,
    procs_per_node: int | None,
    max_nodes: int | None,
    cycle_s: float,
    requeue_lead_s: float | None,
    cold_start_s: float,
    seed: int,
    one_pool: bool | None,
    report: Path | None,
    workers: int | None,
    cluster: str | None,
    as_json: bool,
) -> None:
    """Replay a batch workload under each policy, on the same trace and seed."""
    spec = ReplaySpec(
        workload=workload,
        traces=traces or bundled("traces", "apache", "v100-9zone"),
        days=days,
        pool_size=pool_size,
        notice_s=notice_s,
        checkpoint_s=checkpoint_s,
        procs_per_node=procs_per_node,
        max_nodes=max_nodes,
        cycle_s=cycle_s,
        seed=seed,
        requeue_lead=requeue_lead_s,
        cold_start_s=cold_start_s,
        one_pool=one_pool,
    )
    names = [p.strip() for p in policies.split(",") if p.strip()]
    shown = {"at": -1}

    def progress(policy: str, done: float) -> None:
        tenth = int(done * 10)
        if tenth != shown["at"]:
            shown["at"] = tenth
            print(f"{policy}: {tenth * 10}%", file=sys.stderr, flush=True)

    with input_errors(), sweep_on(workers, cluster) as where:
        _, runs, about = replay(spec, names, progress, where)
    console = make_console(stderr=as_json)
    if about["trace_plays"] > 1:
        console.print(
            f"[yellow]the trace covers {about['trace_days']} of the {about['window_days']} "
            f"days replayed: it repeats from its start ({about['trace_plays']} plays)[/]"
        )
    console.print(_table(runs))
    console.print(f"workload: {about['workload']}")
    if report is not None:
        from sco.apps.replay_report import write_replay_report  # matplotlib: only here

        console.print(f"report: {write_replay_report(runs, about, report)}")
    if as_json:
        out = {"policies": {r.policy: r.outcomes for r in runs}, **about}
        click.echo(json.dumps(out, sort_keys=True))


COLUMNS = (
    ("jobs done", "jobs_completed", "{:d}"),
    ("failed", "jobs_failed", "{:d}"),
    ("wait p50", "wait_p50_s", "{:.0f} s"),
    ("wait p95", "wait_p95_s", "{:.0f} s"),
    ("slowdown", "bounded_slowdown", "{:.2f}"),
    ("requeues", "requeues", "{:d}"),
    ("restart p95", "restart_wait_p95_s", "{:.0f} s"),
    ("lost node-h", "lost_node_hours", "{:.1f}"),
    ("svc down", "service_unavailable_share", "{:.2%}"),
    ("busy", "utilisation", "{:.0%}"),
    ("cost", "cost", "{:.0f}"),
    ("vs guar.", "cost_vs_guaranteed", "{:.0%}"),
)


def _table(runs: list[Replayed]) -> Table:
    table = Table(title="sco replay: what the jobs' users felt")
    table.add_column("policy")
    shown = [c for c in COLUMNS if any(c[1] in r.outcomes for r in runs)]
    for title, _, _ in shown:
        table.add_column(title, justify="right")
    for r in runs:
        cells = []
        for _, key, fmt in shown:
            value = r.outcomes.get(key)
            cells.append("-" if value is None else fmt.format(value))
        table.add_row(r.policy, *cells)
    return table
