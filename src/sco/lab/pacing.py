"""How a simulation paces its controllers and its signal jobs between cycles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sco.domain.pools import Pool
from sco.engine.signals import FleetSignals, track_pool_ages
from sco.engine.signals_jobs import ScoringJob, sample_headroom
from sco.engine.watcher import ExclusionWatcher
from sco.lab.region import SimRegion
from sco.ports import EventLog, FleetStore


class RelayLog(EventLog, Protocol):
    """An event log sharing fleet state's process or database: it relays the outbox."""

    def absorb_outbox(self) -> int: ...


@dataclass
class SignalJobs:
    """The signal jobs between two cycles, in the order a deployment would see them."""

    watcher: ExclusionWatcher
    scorer: ScoringJob
    event_log: RelayLog
    store: FleetStore
    pools: list[Pool]
    headroom_every_s: float
    region: SimRegion | None = None
    signals: FleetSignals | None = None  # what is known of the pools' ages
    _last_sample: float = float("-inf")
    _room_seen: tuple[int, int] = (-1, -1)

    def after_cycle(self, now: float, acted: bool) -> None:
        # The pools' ages follow their room; this is the ages' one writer in a run, so
        # while the room is as at the last look, the ages are as written then.
        if self.region is not None and self.region.room_moves() != self._room_seen:
            self._room_seen = self.region.room_moves()
            ids = [p.id for p in self.pools]
            held = {p: self.region.held_in(p) for p in ids}
            ages = self.signals.ages() if self.signals is not None else None
            track_pool_ages(self.store, ids, self.region.headroom(ids), held, now, ages)
        sampled = False
        if self.region is not None and now - self._last_sample >= self.headroom_every_s:
            sample_headroom(self.region, self.store, self.pools, now)
            self._last_sample, sampled = now, True
        # Events of this cycle reach the watcher before the next cycle plans.
        if (acted or sampled) and self.event_log.absorb_outbox():
            self.watcher.poll(limit=100_000)
        if self.scorer.due(now):
            self.scorer.run(now)


class Pacer:
    """Which controllers cycle at a tick (see `SimulationSpec.idle_resync_s`): one
    whose partition saw nothing happen (its own servers, the pools, the signals, the
    demand) since its last cycle, and that did nothing then, waits for the resync."""

    def __init__(
        self,
        region: SimRegion,
        signals: FleetSignals,
        resync_s: float | None,
        partitions: list[str],
    ) -> None:
        self.region = region
        self.signals = signals
        self.resync_s = resync_s
        self.partitions = partitions
        self._poked = 0
        self._seen: dict[int, tuple[int, int, int, int, int]] = {}
        self._last: dict[int, float] = {}
        self._acted: set[int] = set()

    def poke(self) -> None:
        self._poked += 1

    def _world(self, k: int) -> tuple[int, int, int, int, int]:
        r = self.region
        own = r.server_events.get(self.partitions[k], 0)
        return (own, r.pool_events, r.price_events, self.signals.changes, self._poked)

    def due(self, k: int, now: float) -> bool:
        if self.resync_s is None or k not in self._seen or k in self._acted:
            return True
        return self._seen[k] != self._world(k) or now - self._last[k] >= self.resync_s

    def ran(self, k: int, now: float, acted: bool) -> None:
        self._seen[k] = self._world(k)
        self._last[k] = now
        if acted:
            self._acted.add(k)
        else:
            self._acted.discard(k)
