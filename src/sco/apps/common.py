"""What every `sco` command shares: durations, bad input, the state option."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

if TYPE_CHECKING:
    from sco.assembly.lab import Workers

F = TypeVar("F", bound=Callable[..., Any])

EXIT_BAD_INPUT = 2
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, option: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise click.UsageError(f"{option}: {text!r} is not a duration like 90s, 30m, 12h or 7d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT


def state_url(state: str, must_exist: bool = True) -> str:
    """A SQLite file path or a database URL, as a URL."""
    if "://" in state:
        return state
    path = Path(state)
    if must_exist and not path.is_file():
        raise BadInput(f"--state: {state}: no such file")
    from sco.assembly.state import sqlite_url  # the database's modules: not every command's

    return sqlite_url(path)


def console(stderr: bool) -> Console:
    """Rich output; wide enough for tables when not on a terminal (logs, CI)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 132)


def bundled(*parts: str) -> Path:
    """A path inside the installed package's data folder."""
    return Path(str(resources.files("sco").joinpath("data", *parts)))


def workers_options(f: F) -> F:
    """`--workers N` and `--cluster ADDRESS`: where a command's independent runs go."""
    f = click.option(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="Run on the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786; "
        "the cluster extra; docs/evaluation.md).",
    )(f)
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        envvar="SCO_WORKERS",
        help="Local worker processes for independent runs (default: $SCO_WORKERS, else one "
        "per CPU).",
    )(f)


@contextmanager
def sweep_on(workers: int | None, cluster: str | None) -> Iterator[Workers]:
    """The workers asked for; a cluster that cannot run the sweep exits 2, named."""
    from sco.assembly.lab import SweepError, Workers  # the lab: only where it is used

    try:
        yield Workers(workers, cluster)
    except SweepError as e:
        raise BadInput(str(e)) from None
