"""The exclusion watcher: a continuous consumer of the event log.

Per pool it keeps sliding windows of reclaims, refused creates and attempts,
and checks the thresholds at each piece of bad news (a reclaim or a refused
create; an accepted create only lowers the refusal ratio). When one is
crossed it persists the exclusion (shared by all controllers, exported as an
event) before it commits the offset, so a crash re-reads rather than
forgets. Under a backlog it commits every `commit_every` records rather than
every batch: a commit is a write that would queue behind the producers'
appends, and re-reading after a crash is harmless (event ids are
deduplicated, exclusions are compare-and-swap). Records it cannot read are
parked in the dead-letter table with their offset, counted and logged, never
dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sco.decide.exclusion import ExclusionConfig, WindowCounts, crossing, on_crossing, state_for
from sco.domain.events import (
    CREATE_FAILED,
    CREATE_OK,
    RECLAIM_KINDS,
    LifecycleEvent,
    MalformedEvent,
    decode_event,
)
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion
from sco.domain.times import utc
from sco.ports import EventLog, SignalStore, StateConflict

log = logging.getLogger(__name__)

CONSUMER = "exclusion-watcher"
_RELEVANT = RECLAIM_KINDS | {CREATE_OK, CREATE_FAILED}
_PRUNE_AT = 4096  # attempts kept per pool before the window is trimmed without a check
_TOUCH_EVERY_S = 60.0  # while backed off, the last crossing is rewritten at most this often


@dataclass
class _Window:
    reclaims: deque[float] = field(default_factory=deque)
    failures: deque[float] = field(default_factory=deque)
    attempts: deque[float] = field(default_factory=deque)

    def counts(self, now: float, window_s: float) -> WindowCounts:
        edge = now - window_s
        for q in (self.reclaims, self.failures, self.attempts):
            while q and q[0] <= edge:
                q.popleft()
        return WindowCounts(len(self.reclaims), len(self.failures), len(self.attempts))


@dataclass(frozen=True, slots=True)
class PollResult:
    read: int
    parked: int
    changed: tuple[Exclusion, ...]


class ExclusionWatcher:
    def __init__(
        self,
        log_: EventLog,
        store: SignalStore,
        pools: Sequence[Pool],
        config: ExclusionConfig | None = None,
        consumer: str = CONSUMER,
        on_change: Callable[[Exclusion], None] | None = None,
        commit_every: int = 50_000,
        reload_pools: Callable[[], Sequence[Pool]] | None = None,
    ) -> None:
        """`reload_pools` is asked for the pools again when an event names a pool not
        known yet (a watcher started before the controllers wrote the region's pools,
        or a pool added since): its events are counted, never skipped."""
        self.log = log_
        self._reload_pools = reload_pools
        self._known: set[PoolId] = set()
        self.commit_every = commit_every
        self._uncommitted = 0
        self.store = store
        self.config = config or ExclusionConfig()
        self.consumer = consumer
        self.on_change = on_change
        self._class_of: dict[PoolId, tuple[PoolId, ...]] = {}
        self.set_pools(pools)
        self._windows: dict[PoolId, _Window] = {}
        self._counted: dict[str, float] = {}  # instance -> when its reclaim was counted
        self._seen: dict[str, None] = {}  # recent event ids, oldest first
        self.exclusions = store.exclusions()
        self.parked = 0

    def set_pools(self, pools: Sequence[Pool]) -> None:
        """The pools to watch (a pool added to the region later is watched from here on).
        A flavor class: the spot pools of one flavor, the candidates for each other."""
        by_flavor: dict[str, list[PoolId]] = {}
        for p in pools:
            if p.is_spot:
                by_flavor.setdefault(p.flavor, []).append(p.id)
        self._class_of = {pid: tuple(members) for members in by_flavor.values() for pid in members}
        self._known = {p.id for p in pools}

    def poll(self, limit: int = 10_000) -> PollResult:
        """Consume up to `limit` records; returns what was read, parked and changed."""
        records = self.log.read(self.consumer, limit)
        if not records:
            return PollResult(0, 0, ())
        changed: list[Exclusion] = []
        parked = 0
        relevant = _RELEVANT
        for rec in records:
            try:
                doc = decode_event(rec.payload)
            except MalformedEvent as e:
                parked += 1
                log.warning("%s: parking offset %d: %s", self.consumer, rec.offset, e)
                self.log.dead_letter(self.consumer, rec, str(e))
                continue
            kind = doc["kind"]
            if kind not in relevant:
                continue
            ex = self._observe(
                doc["event_id"], kind, doc["pool"], doc.get("instance"), float(doc["at"])
            )
            if ex is not None:
                changed.append(ex)
        self._uncommitted += len(records)
        if len(records) < limit or self._uncommitted >= self.commit_every:
            self.log.commit(self.consumer, records[-1].offset)
            self._uncommitted = 0
        self.parked += parked
        return PollResult(len(records), parked, tuple(changed))

    def observe(self, e: LifecycleEvent) -> Exclusion | None:
        """Count one event (already read); returns the exclusion it caused, if any."""
        if e.kind not in _RELEVANT:
            return None
        return self._observe(e.event_id, e.kind, e.pool, e.instance, e.at)

    def _observe(
        self, event_id: str, kind: str, pool: PoolId, instance: str | None, at: float
    ) -> Exclusion | None:
        if event_id in self._seen:
            return None  # at-least-once delivery: count each event once
        self._seen[event_id] = None
        if len(self._seen) > 200_000:
            for old in list(self._seen)[:100_000]:
                del self._seen[old]
        if pool not in self._known and self._reload_pools is not None:
            self.set_pools(self._reload_pools())
            self._known.add(pool)  # asked once: a pool still unknown is not asked for again
        if pool not in self._class_of:
            return None  # guaranteed pools are never excluded
        w = self._windows.get(pool)
        if w is None:
            w = self._windows[pool] = _Window()
        if kind in RECLAIM_KINDS:
            if instance is not None:
                if instance in self._counted:
                    return None  # noticed, then vanished: one reclaim
                self._counted[instance] = at
                if len(self._counted) > 100_000:
                    self._prune_counted(at)
            w.reclaims.append(at)
        elif kind == CREATE_FAILED:
            w.failures.append(at)
            w.attempts.append(at)
        else:
            # An accepted create is good news: it only lowers the refusal ratio, so the
            # thresholds are checked at bad news (reclaims, refusals) alone. Most events
            # are these; they cost an append.
            w.attempts.append(at)
            if len(w.attempts) > _PRUNE_AT:
                w.counts(at, self.config.window_s)
            return None
        reason = crossing(w.counts(at, self.config.window_s), self.config)
        return None if reason is None else self._exclude(pool, reason, at)

    def _prune_counted(self, now: float) -> None:
        edge = now - self.config.window_s
        self._counted = {i: t for i, t in self._counted.items() if t > edge}

    def _exclude(self, pool: PoolId, reason: str, now: float) -> Exclusion | None:
        previous = self.exclusions.get(pool)
        if (
            previous is not None
            and previous.active(now)
            and now - previous.last_crossing < _TOUCH_EVERY_S
        ):
            return None  # backed off and recently touched: nothing worth a write
        state = state_for(pool, self._class_of[pool], self.exclusions, now, self.config)
        nxt = on_crossing(pool, previous, state, reason, now, self.config)
        if nxt == previous:
            return None
        event = LifecycleEvent(
            event_id=f"exclusion:{pool}:{nxt.version + 1}",
            at=now,
            partition="",
            pool=pool,
            instance=None,
            kind=str(nxt.state),
            reason=f"{reason}; cooldown {nxt.cooldown_s:.0f}s",
        )
        try:
            saved = self.store.put_exclusion(nxt, event)
        except StateConflict:
            # Another watcher wrote first: take its view and let the next crossing decide.
            self.exclusions = self.store.exclusions()
            return None
        self.exclusions[pool] = saved
        if saved.since == now:
            log.info("pool %s %s until %s: %s", pool, saved.state, utc(saved.until), reason)
        if self.on_change is not None:
            self.on_change(saved)
        return saved
