"""The signal processes: `sco watch`, `sco score` and `sco history load`.

Each reads the event log (the embedded log or Kafka, as `sco.yaml` says) or
pool history, and writes what it concludes to fleet state, where every
controller reads it each cycle. They share nothing in memory with the
controllers, so any of them can run, restart or fail on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import click
from prometheus_client import Counter, Gauge

from sco.apps.process import Process, process
from sco.assembly.settings import Settings
from sco.assembly.wiring import StartError, open_events, open_history, open_store
from sco.domain.pools import Pool
from sco.engine.clock import SystemClock
from sco.engine.signals_jobs import HistoryLoader, score_now
from sco.engine.watcher import ExclusionWatcher

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.2  # an embedded log that had nothing is read again this soon


class Progress:
    """Liveness and readiness of a consumer loop: live while it goes round, ready while
    its last read worked."""

    def __init__(self, stuck_after_s: float = 120.0) -> None:
        self.stuck_after_s = stuck_after_s
        self.at = time.monotonic()
        self.error = ""

    def ok(self) -> None:
        self.at, self.error = time.monotonic(), ""

    def failed(self, e: BaseException) -> None:
        self.at, self.error = time.monotonic(), f"{type(e).__name__}: {str(e)[:200]}"

    def live(self) -> tuple[bool, str]:
        since = time.monotonic() - self.at
        return (since < self.stuck_after_s, f"last turn {since:.1f}s ago")

    def ready(self) -> tuple[bool, str]:
        return (not self.error, self.error or "reading")


def _pools(store: Any) -> list[Pool]:
    pools: list[Pool] = store.pools()
    return pools


def _consume(
    proc: Process,
    step: Callable[[], int],
    progress: Progress,
    on_idle: Callable[[], None] = lambda: None,
) -> None:
    """Call `step` until stopped; back off (doubling to 30 s) while it fails."""
    backoff = 1.0
    while not proc.stop.is_set():
        try:
            n = step()
        except Exception as e:
            progress.failed(e)
            log.warning("%s: %s; retrying in %.0fs", proc.component, progress.error, backoff)
            proc.stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        progress.ok()
        backoff = 1.0
        if not n:
            on_idle()
            proc.stop.wait(IDLE_WAIT_S)


def watch(settings: Settings, verbose: int = 0) -> None:
    """The exclusion watcher, until stopped."""
    store = open_store(settings, patient=True)
    events = open_events(settings, store, patient=True)
    try:
        with process("watch", settings, settings.http.watch_port, verbose) as proc:
            read = Counter("sco_watcher_records", "Event records read.", registry=proc.registry)
            parked = Counter(
                "sco_watcher_parked", "Unreadable records parked.", registry=proc.registry
            )
            changes = Counter(
                "sco_exclusions_written",
                "Exclusions (and degradations) the watcher wrote.",
                ["pool", "state"],
                registry=proc.registry,
            )
            active = Gauge(
                "sco_exclusions_active", "Pools excluded or degraded now.", registry=proc.registry
            )
            watcher = ExclusionWatcher(
                events.log,
                store,
                _pools(store),
                settings.policy.exclusion,
                on_change=lambda ex: changes.labels(ex.pool, str(ex.state)).inc(),
                reload_pools=lambda: _pools(store),
            )
            progress = Progress()
            proc.checks(progress.live, progress.ready)
            clock = SystemClock()

            def step() -> int:
                result = watcher.poll(limit=10_000)
                read.inc(result.read)
                parked.inc(result.parked)
                now = clock.now()
                active.set(sum(1 for ex in watcher.exclusions.values() if ex.active(now)))
                return result.read  # each change is logged once, by the watcher

            click.echo(f"sco watch: reading the {events.kind} event log", err=True)
            _consume(proc, step, progress)
    finally:
        events.close()
        store.close()


def load_history(settings: Settings, verbose: int = 0, score_every_s: float | None = None) -> None:
    """The history loader, until stopped: the event log into pool history; with
    `score_every_s`, the scorer too, on the same pool history (on chDB, the one
    process that opens the engine)."""
    store = open_store(settings, patient=True)
    events = open_events(settings, store, patient=True)
    history = open_history(settings, hold=True)
    try:
        with process("history-load", settings, settings.http.history_port, verbose) as proc:
            loaded = Counter(
                "sco_history_loaded",
                "Event records loaded into pool history.",
                registry=proc.registry,
            )
            parked = Counter(
                "sco_history_parked", "Unreadable records parked.", registry=proc.registry
            )
            loader = HistoryLoader(events.log, history)
            progress = Progress()
            proc.checks(progress.live, progress.ready)
            scoring = _Scoring(proc, settings, store, history, score_every_s)

            def step() -> int:
                before = loader.parked
                n = loader.poll(10_000)
                loaded.inc(n)
                parked.inc(loader.parked - before)
                scoring.when_due()
                return n

            click.echo(
                f"sco history load: {events.kind} event log into {history.dsn.split('@')[-1]}",
                err=True,
            )
            _consume(proc, step, progress)
    finally:
        history.close()
        events.close()
        store.close()


class _Scoring:
    """The scorer inside the history loader (`--score-every`): a pass when one is due,
    between loads; a failed pass is counted and logged, and the loader goes on."""

    def __init__(
        self, proc: Process, settings: Settings, store: Any, history: Any, every_s: float | None
    ) -> None:
        self.settings, self.store, self.history, self.every_s = settings, store, history, every_s
        self.next_at = time.monotonic()
        self.runs = Counter(
            "sco_score_runs", "Scoring passes.", ["outcome"], registry=proc.registry
        )
        self.generation = Gauge(
            "sco_score_generation", "The last score generation written.", registry=proc.registry
        )

    def when_due(self) -> None:
        if self.every_s is None or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        try:
            gen = _score_once(self.settings, self.store, self.history)
        except StartError as e:
            self.runs.labels("failed").inc()
            log.warning("score: %s; next pass in %.0fs", e, self.every_s)
            return
        self.runs.labels("ok").inc()
        self.generation.set(gen)


def score(settings: Settings, every_s: float | None, verbose: int = 0) -> int:
    """Score pools from history into a new generation in fleet state: once, or every
    `every_s` until stopped. Returns the generations written; raises StartError when
    a one-shot pass cannot read history."""
    store = open_store(settings, patient=True)
    history: Any = None  # every pass's, when looping (on chDB, held between passes)
    try:
        with process(
            "score", settings, settings.http.score_port if every_s else 0, verbose
        ) as proc:
            runs = Counter("sco_score_runs", "Scoring passes.", ["outcome"], registry=proc.registry)
            generation = Gauge(
                "sco_score_generation",
                "The last score generation written.",
                registry=proc.registry,
            )
            progress = Progress(stuck_after_s=3 * (every_s or 300.0) + 60)
            proc.checks(progress.live, progress.ready)
            written = 0
            while True:
                try:
                    if every_s is not None and history is None:
                        history = open_history(settings, hold=True)
                    n = _score_once(settings, store, history)
                except StartError as e:
                    runs.labels("failed").inc()
                    progress.failed(e)
                    if every_s is None:
                        raise
                    log.warning("score: %s; next pass in %.0fs", e, every_s)
                else:
                    runs.labels("ok").inc()
                    progress.ok()
                    generation.set(n)
                    written += 1
                if every_s is None or proc.stop.wait(every_s):
                    return written
    finally:
        if history is not None:
            history.close()
        store.close()


def _score_once(settings: Settings, store: Any, history: Any = None) -> int:
    """One pass, on `history` (None: pool history opened for the pass and closed)."""
    pools = {p.id: p for p in _pools(store)}
    if not pools:
        raise StartError("fleet state has no pools yet: start `sco run` first")
    own = history is None
    if own:
        history = open_history(settings)
    try:
        try:
            scores = score_now(history, store, pools, SystemClock().now(), settings.policy.scorer)
        except Exception as e:
            raise StartError(f"history.url: cannot read pool history: {type(e).__name__}") from e
    finally:
        if own:
            history.close()
    gen = scores[0].generation if scores else 0
    best = sorted(scores, key=lambda s: -s.value)[:3]
    click.echo(
        f"score generation {gen}: {len(scores)} pools; best "
        + ", ".join(f"{s.pool} {s.value:.3f}" for s in best),
        err=True,
    )
    return gen
