"""`sco lab`: the commands that make worlds to try sco on."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

import click

from sco.apps.common import BadInput, sweep_on, workers_options

if TYPE_CHECKING:
    from sco.assembly.lab import Kind, Tally, Trial

# Exit codes of `sco lab swarm`: 0 every invariant held, 1 a violation was found.
EXIT_VIOLATION = 1


@click.group("lab")
def lab_group() -> None:
    """Worlds made to try sco's control plane on."""


@lab_group.command("swarm")
@click.option("--seeds", type=int, default=20, show_default=True, help="Worlds to run.")
@click.option("--first-seed", type=int, default=0, show_default=True, help="The first world.")
@click.option("--seed", type=int, default=None, help="Run this one world (a replay).")
@click.option(
    "--faults",
    default="all",
    show_default=True,
    help="The kinds of fault the adversary may use, comma-separated (see --list-faults), "
    "or 'none' (the worlds without faults).",
)
@click.option("--keep", default=None, help="With --seed: only these of its faults (0,3,7).")
@click.option("--list-faults", is_flag=True, help="Print the kinds of fault and exit.")
@click.option(
    "--list-invariants",
    is_flag=True,
    help="Print each invariant, what must hold, and the documentation that promises it.",
)
@workers_options
@click.option("--no-shrink", is_flag=True, help="Do not shrink a failing schedule.")
@click.option("--stop-at-first", is_flag=True, help="Stop at the first failing seed.")
@click.option(
    "--state",
    type=click.Choice(["memory", "sqlite"]),
    default="memory",
    show_default=True,
    help="Fleet state of each world: the in-memory twin, or a SQLite database (the SQL "
    "path); both are held to one conformance suite and a seed gives the same result.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON line on stdout.")
def swarm(
    seeds: int,
    first_seed: int,
    seed: int | None,
    faults: str,
    keep: str | None,
    list_faults: bool,
    list_invariants: bool,
    workers: int | None,
    cluster: str | None,
    no_shrink: bool,
    stop_at_first: bool,
    state: str,
    as_json: bool,
) -> None:
    """Deterministic simulation of the whole control plane under faults.

    Each seed is one world (1-4 Slurm, Kubernetes or plain partitions, 2-9 pools in 1-3
    halls, two replicas of sco, perhaps a second installation in the project) and one
    schedule of faults at every port; sco's real controller, node planes, signal pump,
    watcher, scorer and lease logic run on its simulated clock while named invariants
    are checked. A failing seed prints the command that replays it exactly, and its
    schedule shrunk to the fewest faults that still fail. Exit 0 when every invariant
    held, 1 when one broke, 2 on bad options."""
    from sco.assembly.lab import (
        ALL_KINDS,
        PROMISES,
        Tally,
        fault_names,
        run_trials,
        shrink,
        trials,
    )

    if list_faults:
        for kind in ALL_KINDS:
            click.echo(kind)
        return
    if list_invariants:
        for p in PROMISES:
            click.echo(f'{p.name}\n  holds: {p.holds}\n  {p.doc}: "{p.says}"')
        return
    kinds = _kinds(faults, ALL_KINDS)
    if seed is not None:
        todo = trials(1, seed, kinds, state)
        if keep is not None:
            todo = [_keep(todo[0], keep)]
    elif keep is not None:
        raise BadInput("--keep: only with --seed")
    elif seeds < 1:
        raise BadInput("--seeds: at least 1")
    else:
        todo = trials(seeds, first_seed, kinds, state)
    tally = Tally(state=state)
    started = time.monotonic()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    with sweep_on(workers, cluster) as where:
        for trial, result in run_trials(todo, where):
            tally.add(trial, result)
            if result.violations or seed is not None:
                say(f"seed {trial.seed}: {len(result.violations)} violations")
                for v in result.violations[:10]:
                    say(f"  {v.describe()}")
            if tally.seeds % 50 == 0:
                say(f"{tally.seeds}/{len(todo)} seeds, {time.monotonic() - started:.0f} s")
            if stop_at_first and result.violations:
                break
    for trial, result in tally.failing[:3]:
        say(f"replay: {trial.command()}")
        if not no_shrink:
            small, _ = shrink(trial, result, say)
            say(f"shrunk to {len(small.keep or ())} faults: {small.command()}")
            for name in fault_names(small.spec().faults):
                say(f"  {name}")
    if as_json:
        click.echo(json.dumps(tally.line()))
    else:
        _summary(tally, time.monotonic() - started)
    if tally.violations:
        sys.exit(EXIT_VIOLATION)


def _kinds(text: str, every: tuple[Kind, ...]) -> tuple[Kind, ...]:
    if text == "all":
        return every
    if text == "none":
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - {str(k) for k in every})
    if unknown:
        raise BadInput(f"--faults: unknown {', '.join(unknown)} (see --list-faults)")
    return tuple(k for k in every if str(k) in names)


def _keep(trial: Trial, text: str) -> Trial:
    if text == "none":
        return dataclasses.replace(trial, keep=())
    try:
        picked = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise BadInput(f"--keep: {text!r} is not a list of fault numbers (0,3,7)") from None
    return dataclasses.replace(trial, keep=picked)


def _summary(tally: Tally, wall_s: float) -> None:
    line = tally.line()
    click.echo(
        f"{line['seeds']} worlds, {line['simulated_days']} simulated days, "
        f"{line['faults_injected']} faults, {line['cycles']} cycles in {wall_s:.0f} s: "
        f"{line['invariant_violations']} violations"
    )
    for name, n in sorted(tally.checked.items()):
        click.echo(f"  {name}: {n} checks")
    for why, n in sorted(tally.misses.items(), key=lambda x: -x[1]):
        click.echo(f"  not held against sco ({n}): {why}")
