"""Independent simulations side by side: on every core of this machine, or on a Dask
cluster (`--cluster ADDRESS`, the `cluster` extra).

One rule for every sweep (`sco evaluate`, `sco replay`, `sco lab swarm`, the benches):
the tasks share nothing, each result comes back in the order of its task, so what a
sweep prints is the same on any number of workers; and every worker walks a set of
strings in the same order (`PYTHONHASHSEED` fixed), or a seed would not replay.

Local workers are spawned processes. On a cluster, Dask places the tasks; a worker
lost mid-sweep has its tasks run again elsewhere (Dask's own rescheduling), and each
task's result is taken once, from its future, so none is counted twice. A cluster
that cannot be reached, has no workers, or runs another Python, sco or hash seed is
refused within seconds (`SweepError`).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import platform
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import sco
from sco.engine.gcpolicy import tune_gc

T = TypeVar("T")
R = TypeVar("R")
HASH_SEED = "6640"  # Dask's: its nanny starts every worker with it
CONNECT_S = 5.0  # to reach a scheduler, and for its first worker to show


class SweepError(Exception):
    """Workers that cannot run a sweep: a cluster unreachable, empty or mismatched."""


@dataclass(frozen=True, slots=True)
class Workers:
    """Where a sweep runs: `count` local processes (None: one per CPU), or the Dask
    scheduler at `cluster`. `isolated`: even one local worker is a process of its
    own with the sweep's hash seed (a swarm seed must replay as the swarm ran it)."""

    count: int | None = None
    cluster: str | None = None
    isolated: bool = False

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise SweepError(f"--workers: {self.count}; at least 1")

    @property
    def local(self) -> int:
        return self.count or os.cpu_count() or 1

    @property
    def in_process(self) -> bool:
        """The runs one after another in the caller's own process."""
        return not self.cluster and self.local == 1 and not self.isolated


IN_PROCESS = Workers(1)  # the runs one after another, in this process
EVERY_CORE = Workers()


def sweep(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    workers: Workers = EVERY_CORE,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[R]:
    """`fn` of each task, yielded in the order of `tasks`; `progress(done, total)` as
    each is yielded. `fn` must be a module-level function and the tasks picklable.
    Leaving the loop early cancels what has not started."""
    total = len(tasks)
    if workers.cluster:
        results = _on_dask(fn, tasks, workers.cluster)
    elif workers.in_process or total == 0:
        results = (fn(t) for t in tasks)
    else:
        results = _on_processes(fn, tasks, min(workers.local, total))
    for done, r in enumerate(results, 1):
        if progress is not None:
            progress(done, total)
        yield r


def _on_processes(fn: Callable[[T], R], tasks: Sequence[T], n: int) -> Iterator[R]:
    """Every task submitted at once (the pool feeds its workers a few at a time), so a
    worker never idles behind a long task whose result is awaited first."""
    os.environ["PYTHONHASHSEED"] = HASH_SEED  # the workers are spawned with it
    pool = ProcessPoolExecutor(
        max_workers=n, mp_context=multiprocessing.get_context("spawn"), initializer=tune_gc
    )
    try:
        futures = [pool.submit(fn, t) for t in tasks]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def identity() -> dict[str, str]:
    """What a worker must share with this machine for a sweep to give the same results."""
    return {
        "python": platform.python_version(),
        "sco": sco.__version__,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "(random)"),
    }


def _on_dask(fn: Callable[[T], R], tasks: Sequence[T], address: str) -> Iterator[R]:
    client = connect(address)
    try:
        futures = [client.submit(fn, t, pure=False) for t in tasks]
        for k, future in enumerate(futures):
            try:
                result: R = future.result()
            except Exception as e:
                if type(e).__module__.split(".")[0] != "distributed" and not isinstance(
                    e, OSError | CancelledError
                ):
                    raise  # the run's own error, as in a local run
                raise SweepError(
                    f"--cluster {address}: run {k + 1} of {len(futures)} lost "
                    f"({type(e).__name__}: {e})"
                ) from None
            future.release()
            yield result
    finally:
        client.close()


def connect(address: str) -> Any:
    """A Dask client of the scheduler at `address` whose workers run what this machine
    runs (see `identity`), or `SweepError` within seconds."""
    try:
        client_of: Any = importlib.import_module("distributed").Client
    except ImportError:
        raise SweepError("--cluster needs Dask's distributed: pip install 'sco[cluster]'") from None
    try:
        client = client_of(address, timeout=CONNECT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise SweepError(f"--cluster {address}: cannot reach a Dask scheduler ({e})") from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_S)
        _check(client, address)
        client.run(tune_gc)  # as a local worker collects garbage
    except BaseException as e:
        client.close()
        if isinstance(e, TimeoutError):
            raise SweepError(f"--cluster {address}: no worker joined in {CONNECT_S:g} s") from None
        raise
    return client


def _check(client: Any, address: str) -> None:
    want = identity() | {"PYTHONHASHSEED": HASH_SEED}
    for worker, got in sorted(client.run(identity).items()):
        wrong = [f"{k} {got.get(k)} (here {v})" for k, v in want.items() if got.get(k) != v]
        if wrong:
            raise SweepError(
                f"--cluster {address}: worker {worker} runs {', '.join(wrong)}; start the "
                f"workers with this Python and sco, and PYTHONHASHSEED={HASH_SEED} (Dask's nanny "
                f"gives it unless distributed.nanny.pre-spawn-environ says otherwise)"
            )
