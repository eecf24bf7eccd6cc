"""The slow clock of the signals: load the event log into pool history, score pools.

`HistoryLoader` is a consumer of the event log like the watcher (own offsets,
dead letters); `score_now` reads history and writes one generation of scores;
`ScoringJob` does both every 5 minutes of its clock and hands the scores to
the planner. `sample_headroom` puts each pool's headroom into the stream, the
"recent headroom" the scorer reports.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from sco.decide.scorer import PoolStats, ScorerConfig, score_pools
from sco.domain.events import LifecycleEvent, MalformedEvent, parse_event
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import PoolScore
from sco.ports import EventLog, Outbox, Provider, SignalStore

log = logging.getLogger(__name__)


class PoolHistory(Protocol):
    def load(self, events: Sequence[LifecycleEvent]) -> int: ...

    def pool_stats(self, now: float, window_s: float) -> list[PoolStats]: ...


class HistoryLoader:
    def __init__(self, log_: EventLog, history: PoolHistory, consumer: str = "history-loader"):
        self.log = log_
        self.history = history
        self.consumer = consumer
        self.parked = 0

    def poll(self, limit: int = 10_000) -> int:
        """Load up to `limit` records; returns how many were read."""
        records = self.log.read(self.consumer, limit)
        if not records:
            return 0
        events: list[LifecycleEvent] = []
        for rec in records:
            try:
                events.append(parse_event(rec.payload))
            except MalformedEvent as e:
                self.parked += 1
                log.warning("%s: parking offset %d: %s", self.consumer, rec.offset, e)
                self.log.dead_letter(self.consumer, rec, str(e))
        self.history.load(events)  # idempotent per event id: a crash here re-loads safely
        self.log.commit(self.consumer, records[-1].offset)
        return len(records)

    def drain(self, limit: int = 10_000) -> int:
        total = 0
        while n := self.poll(limit):
            total += n
        return total


def score_now(
    history: PoolHistory,
    store: SignalStore,
    pools: Mapping[PoolId, Pool],
    now: float,
    cfg: ScorerConfig,
) -> list[PoolScore]:
    """Score every spot pool from history and store the generation."""
    stats = history.pool_stats(now, cfg.window_s)
    scores = score_pools(stats, pools, now, cfg)
    generation = store.save_scores(scores)
    return [dataclasses.replace(s, generation=generation) for s in scores]


class ScoringJob:
    """Scores pools every `every_s` of the caller's clock from what the log holds.

    A generation is written when the ranking changes, when a pool's value moves
    by more than `save_delta`, or `save_every_s` after the last one; the planner
    is handed every run's scores either way.
    """

    def __init__(
        self,
        loader: HistoryLoader,
        store: SignalStore,
        pools: Mapping[PoolId, Pool],
        cfg: ScorerConfig | None = None,
        every_s: float = 300.0,
        on_scores: Callable[[float, list[PoolScore]], None] | None = None,
        save_delta: float = 0.01,
        save_every_s: float = 3600.0,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self.loader = loader
        self.store = store
        self.pools = dict(pools)
        self.cfg = cfg or ScorerConfig()
        self.every_s = every_s
        self.on_scores = on_scores
        self.save_delta = save_delta
        self.save_every_s = save_every_s
        self.last_run = float("-inf")
        self.runs = 0
        self.saved = 0
        self._saved: list[PoolScore] = []
        self._saved_at = float("-inf")

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.every_s

    def run(self, now: float) -> list[PoolScore]:
        self.loader.drain()
        stats = self.loader.history.pool_stats(now, self.cfg.window_s)
        # Scored as of the generation saved last: most runs save none (see the class).
        generation = self._saved[0].generation if self._saved else 0
        scores = score_pools(stats, self.pools, now, self.cfg, generation)
        if self._worth_saving(scores, now):
            generation = self.store.save_scores(scores)
            scores = [dataclasses.replace(s, generation=generation) for s in scores]
            self._saved, self._saved_at = scores, now
            self.saved += 1
        self.last_run = now
        self.runs += 1
        if self.on_scores is not None:
            self.on_scores(now, scores)
        return scores

    def _worth_saving(self, scores: list[PoolScore], now: float) -> bool:
        if now - self._saved_at >= self.save_every_s or len(scores) != len(self._saved):
            return True
        return any(
            a.pool != b.pool or abs(a.value - b.value) > self.save_delta
            for a, b in zip(scores, self._saved, strict=True)
        )


def sample_headroom(
    provider: Provider,
    store: Outbox,
    pools: Sequence[Pool],
    now: float,
    period_s: float | None = None,
) -> int:
    """Emit one `headroom` pool event per spot pool; returns how many. With `period_s`
    the event id names the period rather than the moment, so replicas sampling the
    same period emit one sample between them (the outbox skips known ids)."""
    spot = [p.id for p in pools if p.is_spot]
    room = provider.headroom(spot)
    stamp = f"p{int(now // period_s)}" if period_s else f"{now:.3f}"
    events = [
        LifecycleEvent(
            event_id=f"headroom:{pid}:{stamp}",
            at=now,
            partition="",
            pool=pid,
            instance=None,
            kind="headroom",
            reason="sampled",
            value=float(room.get(pid, 0)),
        )
        for pid in spot
    ]
    store.emit(events)
    return len(events)
