"""`sco reclaim`: the cloud operator's side, taking spot servers back with notice
(one partition, a sweep of due deadlines, or a capacity trace replayed)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sco.apps.common import BadInput, parse_duration
from sco.apps.options import config_option, settings_of, start_errors, state_override

SETTLE_S = 3.0  # what a metadata write beside a notice takes to end, at most

if TYPE_CHECKING:
    from sco.assembly.reclaim import Budget, Cloud, Plays, Reclaimer


@click.command()
@config_option
@click.option("--state", default=None, help="Fleet state, to spare serving nodes (state.url).")
@click.option("--hall", default=None, help="The hall whose capacity is wanted back.")
@click.option("--flavor", default=None, help="The flavor whose capacity is wanted back.")
@click.option(
    "--partition",
    default=None,
    help="Only servers of this partition (a drill): with it, --hall and --flavor may be left "
    "out (any).",
)
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
    partition: str | None, count: int | None, notice: str, max_noticed: int | None,
    max_fraction: float | None,
    wait: bool, sweep_only: bool, trace_dir: Path | None, maps: tuple[str, ...],
    speed: float, pool_size: int | None, as_json: bool,
) -> None:  # fmt: skip
    """Take spot capacity back with notice, as a cloud operator would: choose the
    servers of HALL/FLAVOR by least harm within a disruption budget, set their
    `sco:reclaim-at`, and delete them at the deadline."""
    from sco.apps import logs
    from sco.assembly.reclaim import Budget, operator_cloud, trace_pools

    settings = settings_of(config, {"state.url": state_override(state)})
    replaying = trace_dir is not None
    where = partition is not None or (hall is not None and flavor is not None)
    if not (sweep_only or replaying) and (not where or count is None or count < 1):
        raise BadInput(
            "give --hall, --flavor (or --partition) and --count (>= 1), --trace, or --sweep"
        )
    with start_errors():
        plays = trace_pools(trace_dir, maps, pool_size) if trace_dir is not None else None
    if speed <= 0:
        raise BadInput("--speed: more than 0")
    if max_fraction is not None and not 0 < max_fraction <= 1:
        raise BadInput("--max-fraction: between 0 and 1")
    notice_s = parse_duration(notice, "--notice")
    # The sweep reports what it leaves alone (an unreadable notice) in the log.
    logs.setup("reclaim", settings.log.level, settings.log.format)
    with start_errors(), operator_cloud(settings, with_state=bool(state or config)) as cloud:
        _reclaim(cloud, sweep_only, plays, speed, notice_s, (hall, flavor, partition), count,
                 wait, Budget(max_noticed, max_fraction), as_json)  # fmt: skip


def _reclaim(
    cloud: Cloud, sweep_only: bool, plays: Plays | None, speed: float, notice_s: float,
    where: tuple[str | None, str | None, str | None], count: int | None, wait: bool,
    budget: Budget, as_json: bool,
) -> None:  # fmt: skip
    if cloud.warning:
        click.echo(f"warning: {cloud.warning}", err=True)
    reclaimer = cloud.reclaimer
    deleted = reclaimer.sweep()
    if sweep_only:
        _say(
            as_json,
            {"deleted": deleted, "foreign": cloud.foreign()},
            f"deleted {len(deleted)} servers past their notice" + _foreign_note(cloud),
        )
        return
    if plays is not None:
        _replay(reclaimer, plays, speed, notice_s, budget, as_json)
        return
    assert count is not None
    hall, flavor, partition = where
    try:
        done = reclaimer.request(hall, flavor, count, notice_s, budget, partition)
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
        time.sleep(max(0.0, done.deadline - cloud.now()) + 0.5)
        gone = reclaimer.sweep()
        if not as_json:
            click.echo(f"deleted {len(gone)} at the deadline")
    elif done.choice.victims:
        # Nova writes a server's metadata whole, so a write beside the notice (sco handing
        # a new server its token) can take it away, and nothing would set it again once
        # this command is gone: look once more when such a write has ended.
        time.sleep(min(SETTLE_S, max(0.0, done.deadline - cloud.now())))
        gone = reclaimer.sweep()
    noticed = [v.server_id for v in done.choice.victims if v.server_id not in done.failed]
    if as_json:
        click.echo(json.dumps({
            "noticed": noticed,
            "why": {v.server_id: v.why for v in done.choice.victims},
            "failed": list(done.failed), "short": done.choice.short,
            "held_back": dict(done.choice.held_back), "deadline": done.deadline,
            "deleted": deleted + gone, "foreign": cloud.foreign(),
        }, sort_keys=True))  # fmt: skip
    elif cloud.foreign():
        click.echo(_foreign_note(cloud).strip("; "))


def _foreign_note(cloud: Cloud) -> str:
    """The servers of other projects the reclaimer saw and left alone, if any."""
    counts = cloud.foreign_servers()
    if not counts:
        return ""
    by = ", ".join(f"{n} in {p}" for p, n in sorted(counts.items()))
    return f"; left alone {sum(counts.values())} servers outside sco's projects ({by})"


def _replay(
    reclaimer: Reclaimer, plays: Plays, speed: float, notice_s: float, budget: Budget,
    as_json: bool,
) -> None:  # fmt: skip
    import signal
    import threading

    from sco.assembly.reclaim import replay_trace

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def told(t: float, p: Any, done: Any) -> None:
        ids = [v.server_id for v in done.choice.victims if v.server_id not in done.failed]
        doc = {"trace_s": round(t, 1), "hall": p.hall, "flavor": p.flavor, "noticed": ids,
               "short": done.choice.short, "deadline": done.deadline}  # fmt: skip
        _say(as_json, doc, f"trace {t:.0f} s: {p.hall}/{p.flavor}: noticed {len(ids)}"
             + (f", short {done.choice.short}" if done.choice.short else ""))  # fmt: skip

    n = replay_trace(
        reclaimer, plays, speed=speed, notice_s=notice_s, budget=budget,
        stop=stop.is_set, sleep=stop.wait, on_notice=told,
    )  # fmt: skip
    _say(as_json, {"noticed_total": n}, f"trace replayed: {n} servers noticed")


def _say(as_json: bool, doc: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(doc, sort_keys=True) if as_json else text)
