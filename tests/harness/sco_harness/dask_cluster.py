"""A real Dask cluster on loopback for the sweep's tests: `dask scheduler` and `dask
worker` processes, as an operator would start them on their machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DASK = Path(sys.executable).parent / "dask"


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(DASK), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip


@contextmanager
def dask_cluster(folder: Path, workers: int = 2, hash_seed: str | None = None) -> Iterator[str]:
    """The scheduler's address, with `workers` single-threaded worker processes (each
    under a nanny that starts it again if it dies, and gives it Dask's PYTHONHASHSEED)
    joined; with `hash_seed`, workers without a nanny that run under that seed."""
    folder.mkdir(parents=True, exist_ok=True)
    info = folder / "scheduler.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env["DASK_DISTRIBUTED__WORKER__DAEMON"] = "False"
    # A run that took its worker down is run once more, not three times: a run that
    # always does is given up on in seconds.
    env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "1"
    procs = [
        _start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                "--scheduler-file", str(info)], folder / "scheduler.log", env)
    ]  # fmt: skip
    try:
        address = _address(info, procs[0], folder / "scheduler.log")
        # Without a nanny, a worker keeps the hash seed it was started with.
        wenv = env if hash_seed is None else env | {"PYTHONHASHSEED": hash_seed}
        own = [] if hash_seed is None else ["--no-nanny"]
        procs += [
            _start(["worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                    "--no-dashboard", *own, "--local-directory", str(folder / "work")],
                   folder / f"worker-{k}.log", wenv)
            for k in range(workers)
        ]  # fmt: skip
        _wait_for_workers(info, workers, folder)
        yield address
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()


def _address(info: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dask scheduler exited {proc.returncode}: {log.read_text()}")
        if info.exists():
            try:
                return str(json.loads(info.read_text())["address"])
            except (ValueError, KeyError):
                pass
        time.sleep(0.2)
    raise RuntimeError(f"dask scheduler: no address in 60 s: {log.read_text()}")


def _wait_for_workers(info: Path, n: int, folder: Path) -> None:
    import distributed

    make: Any = distributed.Client  # untyped
    with make(scheduler_file=str(info), timeout=30) as client:
        try:
            client.wait_for_workers(n, timeout=90)
        except TimeoutError:
            logs = "".join(p.read_text() for p in sorted(folder.glob("worker-*.log")))
            raise RuntimeError(f"{n} dask workers did not join: {logs}") from None


def die_once(task: tuple[str, int]) -> int:
    """A task whose first run, when it has a marker path, takes its worker process
    down with it (a machine lost mid-sweep): the marker file says it ran before. Its
    result: the square of `x`."""
    marker, x = task
    path = Path(marker)
    if marker and not path.exists():
        path.write_text(str(os.getpid()))
        os._exit(1)
    return x * x


def die_always(x: int) -> int:
    """A run that takes every worker it is given down with it."""
    os._exit(1)


def square(x: int) -> int:
    return x * x


def gc_thresholds(_: object) -> tuple[int, int, int]:
    """How the worker process that runs this collects garbage."""
    import gc

    return gc.get_threshold()
