"""The signal processes from `sco.yaml`: `sco watch`, `sco score` and `sco history load`.

Each reads the event log (the embedded log or Kafka, as `sco.yaml` says) or
pool history, and writes what it concludes to fleet state, where every
controller reads it each cycle. They share nothing in memory with the
controllers, so any of them can run, restart or fail on its own. Their loops are
the engine's (`sco.engine.consumers`); the command around them is `sco.apps`'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from sco.assembly.settings import Settings
from sco.assembly.wiring import Events, StartError, open_events, open_history, open_store
from sco.domain.pools import Pool
from sco.engine.clock import SystemClock
from sco.engine.consumers import Progress, consume
from sco.engine.signals_jobs import HistoryLoader, score_now
from sco.engine.watcher import ExclusionWatcher
from sco.ports import PoolHistory, SignalStore

if TYPE_CHECKING:
    from sco.adapters.clickhouse.history import ClickHouseHistory
    from sco.adapters.sqlstate.store import SqlFleetStore

log = logging.getLogger("sco.apps.signals")

Check = Callable[[], tuple[bool, str]]
Say = Callable[[str], None]  # a line for the operator (stderr)


class Running(Protocol):
    """The long-running process a signal loop runs in: when to stop, where its
    metrics go, and how it says it is live and ready."""

    component: str
    registry: CollectorRegistry
    stop: threading.Event

    def checks(self, live: Check, ready: Check) -> None: ...


# The process around a loop, entered once what it needs is open (the command's).
Process = Callable[[], AbstractContextManager[Running]]


def watch(settings: Settings, process: Process, say: Say) -> None:
    """The exclusion watcher, until stopped."""
    store = open_store(settings, patient=True)
    events = open_events(settings, store, patient=True)
    try:
        with process() as proc:
            _watch(settings, store, events, proc, say)
    finally:
        events.close()
        store.close()


def _watch(
    settings: Settings, store: SqlFleetStore, events: Events, proc: Running, say: Say
) -> None:
    r = proc.registry
    read = Counter("sco_watcher_records", "Event records read.", registry=r)
    parked = Counter("sco_watcher_parked", "Unreadable records parked.", registry=r)
    changes = Counter(
        "sco_exclusions_written",
        "Exclusions (and degradations) the watcher wrote.",
        ["pool", "state"],
        registry=r,
    )
    active = Gauge("sco_exclusions_active", "Pools excluded or degraded now.", registry=r)
    watcher = ExclusionWatcher(
        events.log,
        store,
        store.pools(),
        settings.policy.exclusion,
        on_change=lambda ex: changes.labels(ex.pool, str(ex.state)).inc(),
        reload_pools=store.pools,
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

    say(f"sco watch: reading the {events.kind} event log")
    consume(proc.component, proc.stop, step, progress)


def load_history(
    settings: Settings, process: Process, say: Say, score_every_s: float | None = None
) -> None:
    """The history loader, until stopped: the event log into pool history; with
    `score_every_s`, the scorer too, on the same pool history (on chDB, the one
    process that opens the engine)."""
    store = open_store(settings, patient=True)
    events = open_events(settings, store, patient=True)
    history = open_history(settings, hold=True)
    try:
        with process() as proc:
            _load(settings, store, events, history, proc, say, score_every_s)
    finally:
        history.close()
        events.close()
        store.close()


def _load(
    settings: Settings,
    store: SqlFleetStore,
    events: Events,
    history: ClickHouseHistory,
    proc: Running,
    say: Say,
    score_every_s: float | None,
) -> None:
    r = proc.registry
    loaded = Counter("sco_history_loaded", "Event records loaded into pool history.", registry=r)
    parked = Counter("sco_history_parked", "Unreadable records parked.", registry=r)
    loader = HistoryLoader(events.log, history)
    progress = Progress()
    proc.checks(progress.live, progress.ready)
    scoring = _Scoring(r, settings, store, history, score_every_s, say)

    def step() -> int:
        before = loader.parked
        n = loader.poll(10_000)
        loaded.inc(n)
        parked.inc(loader.parked - before)
        scoring.when_due()
        return n

    say(f"sco history load: {events.kind} event log into {history.dsn.split('@')[-1]}")
    consume(proc.component, proc.stop, step, progress)


class _Scoring:
    """The scorer inside the history loader (`--score-every`): a pass when one is due,
    between loads; a failed pass is counted and logged, and the loader goes on."""

    def __init__(
        self,
        registry: CollectorRegistry,
        settings: Settings,
        store: SqlFleetStore,
        history: PoolHistory,
        every_s: float | None,
        say: Say,
    ) -> None:
        self.settings, self.store, self.history, self.every_s = settings, store, history, every_s
        self.say = say
        self.next_at = time.monotonic()
        self.runs = Counter("sco_score_runs", "Scoring passes.", ["outcome"], registry=registry)
        self.generation = Gauge(
            "sco_score_generation", "The last score generation written.", registry=registry
        )

    def when_due(self) -> None:
        if self.every_s is None or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        try:
            gen = _score_once(self.settings, self.store, self.say, self.history)
        except StartError as e:
            self.runs.labels("failed").inc()
            log.warning("score: %s; next pass in %.0fs", e, self.every_s)
            return
        self.runs.labels("ok").inc()
        self.generation.set(gen)


def score(settings: Settings, every_s: float | None, process: Process, say: Say) -> int:
    """Score pools from history into a new generation in fleet state: once, or every
    `every_s` until stopped. Returns the generations written; raises StartError when
    a one-shot pass cannot read history."""
    store = open_store(settings, patient=True)
    held: list[ClickHouseHistory] = []  # every pass's, when looping (chDB: held between)
    try:
        with process() as proc:
            return _score_passes(settings, store, every_s, proc, say, held)
    finally:
        for history in held:
            history.close()
        store.close()


def _score_passes(
    settings: Settings,
    store: SqlFleetStore,
    every_s: float | None,
    proc: Running,
    say: Say,
    held: list[ClickHouseHistory],
) -> int:
    r = proc.registry
    runs = Counter("sco_score_runs", "Scoring passes.", ["outcome"], registry=r)
    generation = Gauge("sco_score_generation", "The last score generation written.", registry=r)
    progress = Progress(stuck_after_s=3 * (every_s or 300.0) + 60)
    proc.checks(progress.live, progress.ready)
    written = 0
    while True:
        try:
            if every_s is not None and not held:
                held.append(open_history(settings, hold=True))
            n = _score_once(settings, store, say, held[0] if held else None)
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


class _PoolStore(SignalStore, Protocol):
    def pools(self) -> list[Pool]: ...


def _score_once(
    settings: Settings, store: _PoolStore, say: Say, history: PoolHistory | None = None
) -> int:
    """One pass, on `history` (None: pool history opened for the pass and closed)."""
    pools = {p.id: p for p in store.pools()}
    if not pools:
        raise StartError("fleet state has no pools yet: start `sco run` first")
    opened = None
    if history is None:
        history = opened = open_history(settings)
    try:
        try:
            scores = score_now(history, store, pools, SystemClock().now(), settings.policy.scorer)
        except Exception as e:
            raise StartError(f"history.url: cannot read pool history: {type(e).__name__}") from e
    finally:
        if opened is not None:
            opened.close()
    gen = scores[0].generation if scores else 0
    best = sorted(scores, key=lambda s: -s.value)[:3]
    say(
        f"score generation {gen}: {len(scores)} pools; best "
        + ", ".join(f"{s.pool} {s.value:.3f}" for s in best)
    )
    return gen
