"""What the soak watches, beside the processes it drives: each partition's
completed cycles and who ran them (the replicas' /metrics), every process's RSS,
and the leases table. Cycles and Memory sample in a daemon thread until stopped;
the leases are read when asked."""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from sqlalchemy import create_engine, text

_CYCLES = re.compile(r'^sco_partition_last_cycle_timestamp_seconds\{partition="([^"]+)"\} (\S+)$')
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[bench/soak {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


@dataclass
class Cycles:
    """Completed cycles per partition, with the replica that ran each: when each ended
    (`sco_partition_last_cycle_timestamp_seconds`, the replica's own clock, this
    machine's), from every live replica's /metrics every `every_s`. A cycle is missed
    only if a replica completes two between scrapes, which the soak's measures
    (soaklib.run), about the first cycle after a gap, never need."""

    ports: Callable[[], dict[str, int]]
    every_s: float = 0.5
    done: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    _last: dict[tuple[str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Cycles:
        threading.Thread(target=self._loop, name="cycles", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for name, port in self.ports().items():
                self._scrape(name, port)

    def _scrape(self, replica: str, port: int) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return
        ended = {m[1]: float(m[2]) for m in map(_CYCLES.match, body.splitlines()) if m}
        with self._lock:
            for key in [k for k in self._last if k[0] == replica and k[1] not in ended]:
                del self._last[key]  # it stopped leading: the series went
            for partition, at in ended.items():
                before = self._last.get((replica, partition))
                self._last[(replica, partition)] = at
                if before is None or at != before:
                    self.done[partition].append((at, replica))

    def last_before(self, partition: str, at: float) -> float | None:
        with self._lock:
            times = [t for t, _ in self.done.get(partition, []) if t < at]
        return max(times) if times else None

    def first_after(self, partition: str, at: float, not_by: str = "") -> float | None:
        with self._lock:
            times = [t for t, r in self.done.get(partition, []) if t >= at and r != not_by]
        return min(times) if times else None

    def gap_s(self, partition: str, at: float, not_by: str = "") -> float | None:
        """From the last cycle before `at` to the first after it (by another than `not_by`)."""
        last, first = self.last_before(partition, at), self.first_after(partition, at, not_by)
        return None if last is None or first is None else first - last

    def leaderless_s(self, partition: str, at: float, not_by: str = "") -> float | None:
        """From `at` (its leader gone) to the first cycle another than `not_by` ended."""
        first = self.first_after(partition, at, not_by)
        return None if first is None else first - at

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.done.values())


@dataclass
class Memory:
    """Every process's RSS every `every_s`: name -> [(time, bytes)], and its start."""

    pids: Callable[[], dict[str, int]]
    every_s: float = 10.0
    rss: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))
    started: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Memory:
        threading.Thread(target=self._loop, name="memory", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> None:
        for name, pid in self.pids().items():
            try:
                p = psutil.Process(pid)
                self.started.setdefault(name, p.create_time())
                self.rss[name].append((time.time(), p.memory_info().rss))
            except psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def growth(self, warmup_s: float, measure_s: float) -> dict[str, dict[str, float]]:
        """Per process that lived `warmup_s` + `measure_s`: RSS after its warm-up, at the
        end, and the growth between."""
        out = {}
        for name, samples in self.rss.items():
            start = self.started[name]
            after = [(t, b) for t, b in samples if t >= start + warmup_s]
            if not after or after[-1][0] - after[0][0] < measure_s:
                continue
            first, last = after[0][1], after[-1][1]
            out[name] = {
                "rss_mb_after_warmup": round(first / 2**20, 1),
                "rss_mb_end": round(last / 2**20, 1),
                "growth_pct": round(100 * (last / first - 1), 2),
                "measured_s": round(after[-1][0] - after[0][0]),
            }
        return out


class Leases:
    """The leases table, read directly (every replica writes it)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, pool_pre_ping=True)

    def holders(self) -> dict[str, str]:
        """Partition -> holder, for leases not expired."""
        with self.engine.connect() as c:
            rows = c.execute(
                text("SELECT partition, holder FROM leases WHERE expires_at >= :n"),
                {"n": time.time()},
            ).all()
        return {r.partition: r.holder for r in rows}

    def held_by(self, replica: str, tries: int = 20) -> set[str]:
        for _ in range(tries):
            try:
                return {p for p, h in self.holders().items() if h == replica}
            except Exception as e:  # the database failing over
                log(f"leases not readable: {type(e).__name__}")
                time.sleep(0.5)
        return set()

    def close(self) -> None:
        self.engine.dispose()
