"""Fuzzing every input sco reads (issue 17): the cases, and the judges of what a
parser did with them. `bench/fuzz.py` drives them at scale; `tests/test_fuzz.py`
runs a hundred cases of each kind.

The rules a parser is held to:

- It accepts a case, or rejects it with the project's own error for that input
  (`SettingsError`, `RegionFileError`, `DemandFileError`, `TraceError`,
  `MalformedEvent`, `ProviderError`, `SlurmBadOutput`, ...), whose message names
  the file or source and the field.
- Any other exception escaping it is a **crash** (KeyError, TypeError,
  AttributeError, UnicodeDecodeError, RecursionError, OverflowError, a bare
  ValueError, ...). So is a case it accepts in breach of its own documented
  contract (a trace whose times do not increase, a count that is not a whole
  number): what comes after trusts that contract.
- A `sco` command given a bad file exits with status 2 and one line
  `sco: error: ...` on stderr; a traceback, or any other status, is an
  **unclear error**. So is an HTTP 5xx from the distributor's API.

Each kind is a `Target`: a hypothesis strategy of cases, and a check that runs
the code sco runs on such an input. Kinds whose input is a file a `sco` command
reads also say how to run that command on a case (`Target.command`), for a sample
run through the real `sco` in a subprocess.

The apps (settings, the CLI, the distributor's app) are not imported here (nothing
imports `sco.apps`): the driver hands them in as `AppHooks`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

Check = Callable[[Any, "Judge"], None]
Errors = tuple[type[BaseException], ...]


@dataclass(frozen=True, slots=True)
class Finding:
    """A crash or an unclear error: the input kind, what happened, and the input."""

    kind: str
    what: str  # "crash" or "unclear"
    error: str  # "KeyError: 'id'", or what the command printed
    where: str  # the innermost frame of sco's code, "file:line in function"
    case: str  # the input, shortened

    def as_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "what": self.what,
            "error": self.error,
            "where": self.where,
            "case": self.case,
        }


class Judge:
    """Runs the calls of one case and records what they did."""

    def __init__(self, kind: str, case: object) -> None:
        self.kind = kind
        self.case = case
        self.accepted = 0
        self.rejected = 0
        self.findings: list[Finding] = []

    def call(self, fn: Callable[[], Any], clear: Errors) -> Any:
        """`fn()`, or None when it raised: one of `clear` is a rejection, anything
        else a crash."""
        try:
            out = fn()
        except clear:
            self.rejected += 1
            return None
        except Exception as e:
            self.crash(f"{type(e).__name__}: {shorten(str(e), 200)}", where_in_sco(e))
            return None
        self.accepted += 1
        return out

    def must(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, which must not raise at all (a consumer, a query after the case);
        None when it did (a crash). Neither an acceptance nor a rejection."""
        try:
            return fn()
        except Exception as e:
            self.crash(f"{type(e).__name__}: {shorten(str(e), 200)}", where_in_sco(e))
            return None

    def crash(self, error: str, where: str = "") -> None:
        self.findings.append(Finding(self.kind, "crash", error, where, shorten(repr(self.case))))

    def unclear(self, error: str) -> None:
        self.findings.append(Finding(self.kind, "unclear", error, "", shorten(repr(self.case))))

    def expect(self, ok: bool, contract: str) -> None:
        """A contract of what the parser accepted; a breach counts as a crash."""
        if not ok:
            self.crash(f"accepted in breach of its contract: {contract}")


def shorten(text: str, most: int = 400) -> str:
    return text if len(text) <= most else f"{text[: most - 40]}... ({len(text)} chars)"


def where_in_sco(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/sco/" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('/sco/', 1)[1]}:{f.lineno} in {f.name}"


@dataclass(frozen=True, slots=True)
class AppHooks:
    """What of `sco.apps` the fuzzing needs, handed in by its driver."""

    # What `sco config check FILE` does with a file: load, resolve, mask, print.
    check_config: Callable[[Path], object]
    config_errors: Errors  # what it may raise for a bad file (SettingsError)
    # The distributor's ASGI app over a contract store, with limits high enough that
    # the fuzzing itself is not what answers.
    distributor_app: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Target:
    """One input kind: its cases, and a check opened once per run in a folder of its
    own (a world: files, a database, an app) that judges one case at a time."""

    kind: str
    cases: st.SearchStrategy[Any]
    open: Callable[[Path], AbstractContextManager[Check]]
    weight: float = 1.0  # its share of the cases of a run
    # Writes a case's files under a folder and returns the `sco` arguments that read
    # them, for a run of the real command; None: no command reads this input.
    command: Callable[[Any, Path], list[str]] | None = None


@dataclass
class Tally:
    kind: str
    cases: int = 0
    accepted: int = 0
    rejected: int = 0
    command_cases: int = 0
    wall_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)

    @property
    def crashes(self) -> int:
        return sum(1 for f in self.findings if f.what == "crash")

    @property
    def unclear_errors(self) -> int:
        return sum(1 for f in self.findings if f.what == "unclear")

    def add(self, judge: Judge) -> None:
        self.cases += 1
        self.accepted += judge.accepted > 0 and not judge.findings
        self.rejected += judge.accepted == 0 and judge.rejected > 0 and not judge.findings
        self.findings += judge.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cases": self.cases,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "command_cases": self.command_cases,
            "crashes": self.crashes,
            "unclear_errors": self.unclear_errors,
            "wall_s": round(self.wall_s, 1),
        }


Progress = Callable[[Tally], None]


def _settings(n: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=n,
        database=None,
        deadline=None,
        derandomize=False,
        phases=(Phase.generate,),  # nothing fails: every case is counted, none shrunk
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def run_target(
    target: Target,
    n: int,
    seed: int,
    progress: Progress | None = None,
    every_s: float = 10.0,
) -> Tally:
    """Judge `n` cases of `target` drawn with `seed`."""
    tally = Tally(target.kind)
    started = last = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=f"sco-fuzz-{target.kind}-") as tmp,
        target.open(Path(tmp)) as check,
    ):

        @_settings(n)
        @fixed_seed(seed)
        @given(target.cases)
        def one(case: Any) -> None:
            nonlocal last
            judge = Judge(target.kind, case)
            check(case, judge)
            tally.add(judge)
            now = time.monotonic()
            if progress is not None and now - last >= every_s:
                last = now
                tally.wall_s = now - started
                progress(tally)

        one()
    tally.wall_s = time.monotonic() - started
    return tally


def draw_cases(target: Target, n: int, seed: int) -> list[Any]:
    """`n` cases of `target`, drawn with `seed`, for the runs of the real command."""
    out: list[Any] = []

    @_settings(n)
    @fixed_seed(seed)
    @given(target.cases)
    def keep(case: Any) -> None:
        out.append(case)

    keep()
    return out


# ---------------------------------------------------------------- the real command


def sco_command() -> list[str]:
    """How to start `sco` from this interpreter's environment."""
    exe = Path(sys.executable).with_name("sco")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sco.apps.cli"]


def run_sco(args: Sequence[str], cwd: Path, timeout_s: float = 120.0) -> tuple[int, str]:
    """Run `sco ARGS`; its exit status and stderr (status -1 when it hung)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCO_")}
    try:
        done = subprocess.run(
            [*sco_command(), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, f"no answer in {timeout_s:.0f} s"
    return done.returncode, done.stderr


def judge_exit(judge: Judge, args: Sequence[str], status: int, stderr: str) -> None:
    """A command given a file either works (0) or says why in one line and exits 2."""
    lines = stderr.strip().splitlines()
    if "Traceback (most recent call last)" in stderr:
        tail = lines[-1] if lines else ""
        judge.unclear(f"sco {' '.join(args)}: traceback: {shorten(tail, 200)}")
    elif status not in (0, 2):
        judge.unclear(f"sco {' '.join(args)}: exit status {status}: {shorten(stderr, 200)}")
    elif status == 2 and not any(line.startswith("sco: error: ") for line in lines):
        judge.unclear(f"sco {' '.join(args)}: exit status 2 without 'sco: error:'")
    elif status == 0:
        judge.accepted += 1
    else:
        judge.rejected += 1


def run_commands(
    target: Target, cases: Sequence[Any], workers: int = 2, progress: Progress | None = None
) -> Tally:
    """Run the real `sco` on each case (`workers` at once)."""
    from concurrent.futures import ThreadPoolExecutor

    assert target.command is not None
    command = target.command
    tally = Tally(target.kind)
    started = time.monotonic()

    def one(i_case: tuple[int, Any]) -> Judge:
        i, case = i_case
        judge = Judge(target.kind, case)
        with tempfile.TemporaryDirectory(prefix=f"sco-fuzz-cli-{target.kind}-{i}-") as tmp:
            folder = Path(tmp)
            args = command(case, folder)
            status, stderr = run_sco(args, folder)
        judge_exit(judge, args, status, stderr)
        return judge

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for judge in pool.map(one, enumerate(cases)):
            tally.add(judge)
            tally.command_cases += 1
            if progress is not None and tally.cases % 20 == 0:
                tally.wall_s = time.monotonic() - started
                progress(tally)
    tally.wall_s = time.monotonic() - started
    return tally


@contextmanager
def no_world(check: Check) -> Iterator[Check]:
    yield check


__all__ = [
    "AppHooks",
    "Check",
    "Finding",
    "Judge",
    "Tally",
    "Target",
    "draw_cases",
    "judge_exit",
    "run_commands",
    "run_sco",
    "run_target",
]
