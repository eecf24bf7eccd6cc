"""Services a test or bench starts stop when it ends, however it ends.

Python's default SIGTERM (and SIGHUP) kills the process without running a
`finally:` block, a context manager's exit or an `atexit` hook, so a bench
stopped by `timeout`, `kill` or a closed terminal used to leave the whole Nova
stack, PostgreSQL and the broker running. Three pieces fix that, once for every
bench and fixture:

- `install()` makes SIGTERM and SIGHUP raise `Terminated` in the main thread,
  a `KeyboardInterrupt`, so they unwind the stack exactly as Ctrl-C does (and
  pytest, which tears its session down on a KeyboardInterrupt, does so for
  them too). Only the first signal raises: later ones are noted and ignored,
  so the clean-up they started runs to its end.
- A registry of what was started: each service class calls `started()` when
  it starts something (before it is up: a half-started service is stopped
  too) and `forget()` when it stopped it. Whatever is still registered when
  the process exits is stopped, newest first, by an `atexit` hook (which runs
  after an unhandled exception, a KeyboardInterrupt included). `started()`
  installs the signal handlers if nobody else handles those signals, so a
  bench that forgot `stop_on_signals()` is covered all the same.
- Every subprocess runs in a session (and process group) of its own, and is
  stopped as a group: the shell script's helpers, a gunicorn's workers, a
  Patroni's PostgreSQL go with it. `run()` runs a command to its end; if the
  wait is cut short (its timeout, a signal) the command's group gets SIGTERM
  first, so a script's trap can stop what it started (`nova.sh up` does), and
  SIGKILL after a grace period. `spawn()` starts a long-running one and
  `stop_group()` stops it.

`stop_on_signals()` wraps a bench's `main`: the handlers, every registered
service stopped on the way out, and exit status 128 + the signal (143 for
SIGTERM, as `timeout` and orchestrators expect).

Not covered: SIGKILL, which no process can act on. PR_SET_PDEATHSIG would
reach direct children only (most services here are daemons a script forked,
or a `runuser`'s grandchildren), and it fires when the *thread* that forked
them exits, so it is not used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwind as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(eq=False)
class Started:
    """One service in the registry: its name (for the log) and how to stop it."""

    name: str
    stop: Callable[[], object]
    at: float = field(default_factory=time.monotonic)


class _State:
    installed = False
    terminating: int | None = None  # the first signal, once one arrived


_lock = threading.Lock()
_started: list[Started] = []
_state = _State()


def _log(text: str) -> None:
    print(f"[sco_harness.services] {text}", file=sys.stderr, flush=True)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _state.terminating is not None:
        _log(f"{signal.Signals(signum).name} again: still stopping what was started")
        return
    _state.terminating = signum
    _log(f"{signal.Signals(signum).name}: stopping what was started")
    raise Terminated(signum)


def install() -> bool:
    """SIGTERM and SIGHUP raise `Terminated` from now on. Idempotent. Only from the
    main thread (Python runs handlers there), and a signal someone else already
    handles is left alone; whether the handlers are ours."""
    if _state.installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in HANDLED:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)
    _state.installed = True
    return True


def started(name: str, stop: Callable[[], object]) -> Started:
    """Register a service that is starting; `stop` must be safe to call on a
    half-started one and more than once."""
    install()
    entry = Started(name, stop)
    with _lock:
        _started.append(entry)
    return entry


def forget(entry: Started | None) -> None:
    """The service stopped (or is handed over, as `lab up` hands its stack to the user)."""
    if entry is None:
        return
    with _lock, contextlib.suppress(ValueError):
        _started.remove(entry)


def running() -> list[str]:
    """The names of the services registered and not stopped, oldest first."""
    with _lock:
        return [e.name for e in _started]


def stop_all(keep: Collection[Started] = ()) -> None:
    """Stop every registered service but those in `keep`, newest first; one that fails
    to stop is reported and the others are still stopped."""
    while True:
        with _lock:
            left = [e for e in _started if e not in keep]
            if not left:
                return
            entry = left[-1]
            _started.remove(entry)
        try:
            entry.stop()
        except BaseException as e:  # a second Ctrl-C included: go on with the others
            _log(f"stopping {entry.name} failed: {type(e).__name__}: {e}")


atexit.register(stop_all)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """For a bench's `main`: SIGTERM and SIGHUP unwind it, every service registered
    within is stopped on the way out, and a signal exits with 128 + its number."""
    install()
    with _lock:
        before = list(_started)
    try:
        yield
    except Terminated as e:
        stop_all(keep=before)
        raise SystemExit(128 + e.signum) from None
    finally:
        stop_all(keep=before)


# ---------------------------------------------------------------- subprocesses


def stop_group(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    sig: int = signal.SIGTERM,
    grace_s: float = 10.0,
) -> int:
    """Send `sig` to the process's group (it leads one: see `spawn`), SIGKILL the group
    if the process is still there after `grace_s`, and reap it; its exit status."""
    if proc.returncode is not None:
        return proc.returncode  # reaped before: its pid, and group id, may be reused
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # unreaped, even a zombie leader keeps the id ours
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # Anything left in its group goes now (a worker, a helper); right after the
    # reap, the id cannot have been handed to anyone else yet.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def spawn(
    args: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a long-running command in a session of its own, its output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(args),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 900.0,
    grace_s: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end in a session of its own, its output captured (the
    caller checks the return code). If the wait ends otherwise — its timeout, a
    signal — its group gets SIGTERM, then SIGKILL after `grace_s`, and the error
    goes on."""
    proc = subprocess.Popen(
        list(args),
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=grace_s)  # read on: a full pipe would block its trap
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def answered(url: str, proc: subprocess.Popen[str], within_s: float = 60.0) -> bytes:
    """The body `url` answers once `proc` serves it; fails the test with the
    process's stderr if it dies or stays silent past `within_s`."""
    import urllib.request

    import pytest

    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bytes(r.read())
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"{url} did not answer: {(proc.communicate()[1] or '')[-2000:]}")
            time.sleep(0.2)
