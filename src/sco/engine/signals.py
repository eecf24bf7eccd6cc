"""Pool signals (and operators' intents) as fleet state holds them: what every
controller plans with.

Nothing a decision depends on lives in one process's memory only. The
watcher writes exclusions, the scorer score generations, controllers the
reclaims they observe (as transitions), and the pool-age job since when each
pool has had capacity; `FleetSignals` reads all of it back, so two replicas,
or a replica restarted mid-exclusion, plan with the same signals.

Reading is cheap: exclusions and scores reload only when the store's stamp
(the exclusions' versions, the latest score generation) moved; reclaims are
read by time, from a little before the last read (a transaction may commit
after a later one was read); pool ages are one small table. A refresh serves
every controller of the process for `refresh_s` of its clock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping

from sco.domain.demand import HANDBACK
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, ExclusionState, PoolScore
from sco.ports import IntentStore, PoolAgeStore, SignalStore


class FleetSignals:
    """Exclusions, scores, recent reclaims and pool ages, read from fleet state.

    Thread-safe: the controllers of one process share one.
    """

    def __init__(
        self,
        store: SignalStore,
        intents: IntentStore,
        pools: Iterable[Pool],
        *,
        window_s: float = 3600.0,
        refresh_s: float = 0.0,
        lookback_s: float = 60.0,
    ) -> None:
        self.store = store
        self.intent_store = intents
        self.window_s = window_s
        self.refresh_s = refresh_s
        self.lookback_s = lookback_s
        self._spot = {p.id for p in pools if p.is_spot}
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, float, int] | None = None
        self._exclusions: dict[PoolId, Exclusion] = {}
        self._scores: dict[PoolId, PoolScore] = {}
        self._ages: dict[PoolId, float | None] = {}
        self._intents: dict[str, str] = {}
        self._reclaims: dict[PoolId, deque[float]] = {}
        self._counted: dict[str, float] = {}  # instance -> when its reclaim was counted
        self._read_to: float | None = None
        self._refreshed_at = float("-inf")
        self.changes = 0  # exclusion changes and score generations seen
        self.episodes = 0  # exclusions and degradations begun

    # ------------------------------------------------------------ reading

    def refresh(self, now: float) -> bool:
        """Read what moved since the last refresh (at most every `refresh_s`); returns
        whether exclusions or scores changed."""
        with self._lock:
            if now - self._refreshed_at < self.refresh_s or now == self._refreshed_at:
                return False
            self._refreshed_at = now
            moved = self._reload_if_moved()
            self._read_reclaims(now)
            return moved

    def _reload_if_moved(self) -> bool:
        """Reload what the stamp says moved; True when exclusions or scores did."""
        stamp = self.store.signal_stamp()
        if stamp == self._stamp:
            return False
        before = self._stamp
        self._stamp = stamp
        moved = before is None or stamp[:2] != before[:2]
        if before is None or stamp[0] != before[0]:
            fresh = self.store.exclusions()
            for pool, ex in fresh.items():
                old = self._exclusions.get(pool)
                if old is None or ex.since != old.since:
                    self.episodes += 1
            self._exclusions = fresh
        if before is None or stamp[1] != before[1]:
            self._scores = self.store.latest_scores()
        if before is None or stamp[2] != before[2]:
            self._ages = self.store.pool_ages()
        if before is None or stamp[3] != before[3]:
            self._intents = self.intent_store.intents()
        if moved:
            self.changes += 1
        return moved

    def _read_reclaims(self, now: float) -> None:
        start = now - self.window_s
        since = start if self._read_to is None else max(start, self._read_to - self.lookback_s)
        for pool, instance, at in self.store.reclaims_since(since):
            if pool not in self._spot or instance in self._counted:
                continue  # noticed, then vanished: one reclaim
            self._counted[instance] = at
            self._reclaims.setdefault(pool, deque()).append(at)
        self._read_to = now
        if len(self._counted) > 10_000:
            self._counted = {i: t for i, t in self._counted.items() if t >= start}

    def invalidate(self) -> None:
        """The next refresh reads fleet state whatever `refresh_s` says (the pump saw a
        new exclusion or score generation land)."""
        with self._lock:
            self._refreshed_at = float("-inf")

    def note_reclaim(self, pool: PoolId, instance: str, at: float) -> None:
        """A reclaim this process just recorded: counted now rather than at the next
        refresh (and once, when the refresh reads it back)."""
        if pool not in self._spot:
            return
        with self._lock:
            if instance in self._counted:
                return
            self._counted[instance] = at
            self._reclaims.setdefault(pool, deque()).append(at)

    # ------------------------------------------------------------ what a snapshot reads

    def state(self, pool: PoolId, now: float) -> ExclusionState | None:
        ex = self._exclusions.get(pool)
        return ex.state if ex is not None and ex.active(now) else None

    def exclusions(self, now: float) -> dict[PoolId, Exclusion]:
        """The exclusions in force now."""
        return {p: ex for p, ex in self._exclusions.items() if ex.active(now)}

    def score(self, pool: PoolId) -> PoolScore | None:
        return self._scores.get(pool)

    @property
    def scored_at(self) -> float:
        """When the scores in use were computed (0: there are none)."""
        return max((s.computed_at for s in self._scores.values()), default=0.0)

    @property
    def generation(self) -> int:
        """The score generation in use (0: none yet)."""
        return self._stamp[1] if self._stamp else 0

    def recent_reclaims(self, pool: PoolId, now: float) -> int:
        """Reclaims in `pool` within the window before `now`, of every partition."""
        times = self._reclaims.get(pool)
        if not times:
            return 0
        with self._lock:
            while times and times[0] < now - self.window_s:
                times.popleft()
            return sum(1 for t in times if t <= now)

    def last_reclaim(self, pool: PoolId) -> float | None:
        times = self._reclaims.get(pool)
        return times[-1] if times else None

    def intent(self, partition: str) -> str | None:
        """What the operator asked of `partition` (`handback`), if anything."""
        return self._intents.get(partition)

    def handed_back(self, partition: str) -> bool:
        """Whether the operator has handed `partition` back, read from fleet state now
        rather than at the last refresh: a create about to go out asks."""
        return self.intent_store.intents().get(partition) == HANDBACK

    def up_since(self, pool: PoolId) -> float | None:
        """Since when `pool` has had capacity; None when it has none or no one said."""
        return self._ages.get(pool)

    def ages(self) -> dict[PoolId, float | None]:
        """Every pool's age as last read."""
        return dict(self._ages)


def track_pool_ages(
    store: PoolAgeStore,
    pools: Iterable[PoolId],
    headroom: Mapping[PoolId, int],
    held: Mapping[PoolId, int],
    now: float,
    ages: Mapping[PoolId, float | None] | None = None,
) -> int:
    """Record, for each pool, since when it has had capacity (headroom, or instances
    held there by any partition): set when it gains some, cleared when it has none.
    Written only on a change, and only if still unchanged (every replica runs this;
    the first to see a change writes it). `ages`: what is known to be stored (default:
    read it). Returns how many pools changed."""
    ages = store.pool_ages() if ages is None else ages
    changed = 0
    for pool in pools:
        has = headroom.get(pool, 0) + held.get(pool, 0) > 0
        had = ages.get(pool) is not None
        if has != had and store.set_pool_age(pool, now if has else None):
            changed += 1
    return changed
