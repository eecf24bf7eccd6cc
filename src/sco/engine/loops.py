"""Partitions independent in time: one thread per partition, each on its own schedule.

A partition's controller cycles every `interval_s`, or sooner when woken (a
new exclusion or intent), whatever the other partitions are doing: a create
that waits a minute for Nova's scheduler, or a listing that times out, holds up
its own partition only. Pacing uses the monotonic clock of the shell; the
controllers keep the injected clock for their decisions.

Each loop keeps a phase of its own within the interval, as far from the other
loops' phases as it can be: loops started together (a replica taking its
leases) would otherwise list the cloud together at every interval, and the
cloud's API answers a burst one listing after another.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sco.engine.controller import PartitionController
from sco.engine.cycle import CycleReport
from sco.ports import FencedOut

log = logging.getLogger(__name__)


@dataclass
class _Loop:
    controller: PartitionController
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    cycles: int = 0
    last_cycle_s: float = 0.0  # how long the last cycle took
    last_end: float = 0.0  # monotonic time it ended
    failing: str = ""  # the last cycle's failure (`describe`), "" after a success
    failures: int = 0  # cycles in a row that failed so
    phase: float = 0.0  # its cycles start at phase + k * interval (monotonic, from the epoch)


def spread_phase(taken: list[float], period: float) -> float:
    """The phase in [0, period) farthest from every phase `taken`: the middle of the
    widest gap between them, round the circle."""
    if not taken:
        return 0.0
    ordered = sorted(p % period for p in taken)
    gaps = [(b - a, a) for a, b in itertools.pairwise(ordered)]
    gaps.append((ordered[0] + period - ordered[-1], ordered[-1]))
    width, start = max(gaps, key=lambda g: (g[0], -g[1]))
    return (start + width / 2) % period


def next_start(now: float, phase: float, period: float) -> float:
    """The first time after `now` at phase + k * period."""
    return phase + (math.floor((now - phase) / period) + 1) * period


class PartitionLoops:
    """Start, wake and stop one loop per partition.

    `may_act(name)` is asked before each cycle (a replica acts only with lease
    time to spare); `on_report` gets every cycle's report; `on_fenced(name, error)` is
    called when the database refused a write (another replica leads now) and
    that partition's loop ends. `cycles` ends a loop after that many cycles.
    """

    def __init__(
        self,
        interval_s: float,
        on_report: Callable[[CycleReport], None] = lambda _r: None,
        may_act: Callable[[str], bool] = lambda _n: True,
        on_fenced: Callable[[str, FencedOut], None] = lambda _n, _e: None,
        cycles: int | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.on_report = on_report
        self.may_act = may_act
        self.on_fenced = on_fenced
        self.cycles = cycles
        self._loops: dict[str, _Loop] = {}
        self._lock = threading.Lock()

    def start(self, name: str, controller: PartitionController) -> bool:
        """Start `name`'s loop; False while its previous loop is still finishing a
        cycle (two controllers of one partition never run at once)."""
        with self._lock:
            old = self._loops.get(name)
            if old is not None and old.thread is not None and old.thread.is_alive():
                return not old.stop.is_set()  # running already; or finishing: not yet
            taken = [
                other.phase
                for other in self._loops.values()
                if other.thread is not None and other.thread.is_alive() and not other.stop.is_set()
            ]
            loop = _Loop(controller, phase=spread_phase(taken, self.interval_s))
            loop.thread = threading.Thread(
                target=self._run, args=(name, loop), name=f"sco-{name}", daemon=True
            )
            self._loops[name] = loop
        loop.thread.start()
        return True

    def busy(self, name: str) -> bool:
        """Whether a loop of `name` is still running (perhaps finishing after a stop)."""
        with self._lock:
            loop = self._loops.get(name)
        return loop is not None and loop.thread is not None and loop.thread.is_alive()

    def stop(self, name: str) -> None:
        """Ask `name`'s loop to end after its current cycle."""
        with self._lock:
            loop = self._loops.get(name)
        if loop is not None:
            loop.stop.set()
            loop.wake.set()

    def stop_all(self, wait_s: float | None = None) -> None:
        with self._lock:
            loops = list(self._loops.values())
        for loop in loops:
            loop.stop.set()
            loop.wake.set()
        if wait_s is not None:
            deadline = time.monotonic() + wait_s
            for loop in loops:
                if loop.thread is not None:
                    loop.thread.join(max(0.0, deadline - time.monotonic()))

    def wake_all(self) -> None:
        """Cycle every partition now (a signal changed)."""
        with self._lock:
            loops = list(self._loops.values())
        for loop in loops:
            loop.wake.set()

    def running(self) -> list[str]:
        with self._lock:
            return [
                n
                for n, loop in self._loops.items()
                if loop.thread is not None and loop.thread.is_alive() and not loop.stop.is_set()
            ]

    def done(self) -> bool:
        """Every loop has ended (with `cycles`, each did that many)."""
        with self._lock:
            return all(
                loop.thread is None or not loop.thread.is_alive() for loop in self._loops.values()
            )

    def stalest_s(self) -> float:
        """The longest any running loop has gone without finishing a cycle (health)."""
        now = time.monotonic()
        with self._lock:
            ages = [
                now - (loop.last_end or now)
                for loop in self._loops.values()
                if loop.thread is not None and loop.thread.is_alive()
            ]
        return max(ages, default=0.0)

    def _run(self, name: str, loop: _Loop) -> None:
        loop.last_end = time.monotonic()
        while not loop.stop.is_set():
            started = time.monotonic()
            loop.wake.clear()
            if self.may_act(name):
                try:
                    report = loop.controller.cycle()
                except FencedOut as e:
                    self.on_fenced(name, e)
                    return
                except Exception as e:
                    # A bug in one partition's cycle must not stop it for good, nor others.
                    self._failed(name, loop, e)
                else:
                    if loop.failing:
                        log.info(
                            "partition %s: cycles succeed again after %d failed",
                            name,
                            loop.failures,
                        )
                    loop.failing, loop.failures = "", 0
                    loop.cycles += 1
                    self.on_report(report)
                loop.last_end = time.monotonic()
                loop.last_cycle_s = loop.last_end - started
                if self.cycles is not None and loop.cycles >= self.cycles:
                    return
            else:
                loop.last_end = time.monotonic()
            now = time.monotonic()
            loop.wake.wait(next_start(now, loop.phase, self.interval_s) - now)

    @staticmethod
    def _failed(name: str, loop: _Loop, e: Exception) -> None:
        """The traceback once; the same failure again (a database that stays away, a
        full disk) is one line per cycle, not a traceback every interval."""
        why = describe(e)
        if why == loop.failing:
            loop.failures += 1
            log.warning(
                "partition %s: cycle failed again (%d in a row): %s", name, loop.failures, why
            )
            return
        loop.failing, loop.failures = why, 1
        log.exception("partition %s: cycle failed: %s", name, why)


def describe(e: BaseException) -> str:
    """An exception as one line: its kind and the first line of its message (a database
    driver's own words, e.g. "database or disk is full", never the statement or its
    parameters, which follow on later lines)."""
    lines = str(e).strip().splitlines()
    first = lines[0].strip()[:300] if lines else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
