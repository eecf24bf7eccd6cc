"""The slow clock of the signals: load the event log into pool history, score pools.

`HistoryLoader` is a consumer of the event log like the watcher (own offsets,
dead letters); `score_now` reads history and writes one generation of scores.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from sco.decide.scorer import PoolStats, ScorerConfig, score_pools
from sco.domain.events import LifecycleEvent, MalformedEvent, parse_event
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import PoolScore
from sco.ports import EventLog, FleetStore

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
    store: FleetStore,
    pools: Mapping[PoolId, Pool],
    now: float,
    cfg: ScorerConfig,
) -> list[PoolScore]:
    """Score every spot pool from history and store the generation."""
    stats = history.pool_stats(now, cfg.window_s)
    scores = score_pools(stats, pools, now, cfg)
    generation = store.save_scores(scores)
    return [dataclasses.replace(s, generation=generation) for s in scores]
