"""The signal pump of a `sco run` replica: what moves between the controllers and
the rest of the control plane, on a thread of its own.

- **Relay**: the transactional outbox into the event log (the embedded log or
  Kafka), every `relay_every_s`. Every replica relays; on PostgreSQL they take
  different rows, and readers drop event ids they have seen (at least once).
- **Pool ages**: since when each pool has had capacity, written to fleet state
  when it changes (`sco.engine.signals.track_pool_ages`).
- **Headroom samples** into the stream every `headroom_every_s`, the "recent
  headroom" the scorer reports (one per pool and period across replicas).
- **Wake-ups**: when a new exclusion or score generation lands in fleet state,
  every partition this replica leads cycles at once rather than at its next
  interval, so the watcher's word is acted on within a second or two.

A step that fails (database or broker unreachable) is logged and tried again
at its next turn; nothing is lost, since the outbox keeps what was not relayed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from sco.domain.pools import Pool
from sco.engine.signals import track_pool_ages
from sco.engine.signals_jobs import sample_headroom
from sco.ports import Clock, Outbox, Provider, SignalStore

log = logging.getLogger(__name__)

Relay = Callable[[], int]  # move all the outbox holds into the event log; returns how many


@dataclass(frozen=True, slots=True)
class PumpConfig:
    relay_every_s: float = 0.2
    ages_every_s: float = 15.0
    headroom_every_s: float = 1800.0
    stamp_every_s: float = 0.5


class SignalPump:
    def __init__(
        self,
        *,
        outbox: Outbox,
        signals: SignalStore,
        provider: Provider,
        pools: Sequence[Pool],
        relay: Relay | None,
        clock: Clock,
        on_signals: Callable[[], None],
        config: PumpConfig | None = None,
        registry: CollectorRegistry | None = None,
        pace: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pace` times the steps (the shell's monotonic clock; a simulation's own)."""
        self.pace = pace
        self.outbox = outbox
        self.signals = signals
        self.provider = provider
        self.pools = list(pools)
        self.relay = relay
        self.clock = clock
        self.on_signals = on_signals
        self.config = config or PumpConfig()
        self._stamp: tuple[int, int, float, int] | None = None
        self._last: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.relayed = Counter(
            "sco_outbox_relayed_total",
            "Events moved from the outbox into the event log by this replica.",
            registry=registry,
        )
        self.errors = Counter(
            "sco_signal_pump_errors_total",
            "Steps of the signal pump that failed (relay, ages, headroom, stamp).",
            ["step"],
            registry=registry,
        )
        self.backlog = Gauge(
            "sco_outbox_backlog",
            "Events in the outbox not yet relayed, as this replica last saw.",
            registry=registry,
        )

    def step(self) -> None:
        """One turn: whatever is due."""
        now_mono = self.pace()
        c = self.config
        if self._due("ages", c.ages_every_s, now_mono):
            self._guard("ages", self._ages)
        if self._due("headroom", c.headroom_every_s, now_mono):
            self._guard("headroom", self._headroom)
        if self.relay is not None and self._due("relay", c.relay_every_s, now_mono):
            self._guard("relay", self._relay_all)
        if self._due("stamp", c.stamp_every_s, now_mono):
            self._guard("stamp", self._check_stamp)

    def _due(self, what: str, every_s: float, now: float) -> bool:
        if now - self._last.get(what, float("-inf")) < every_s:
            return False
        self._last[what] = now
        return True

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as e:
            self.errors.labels(what).inc()
            log.warning("signal pump: %s failed: %s", what, _first_line(e))

    def _relay_all(self) -> None:
        assert self.relay is not None
        n = self.relay()
        if n:
            self.relayed.inc(n)
        self.backlog.set(self.outbox.outbox_size())

    def _check_stamp(self) -> None:
        stamp = self.signals.signal_stamp()
        before = self._stamp
        self._stamp = stamp
        # Exclusions and intents change plans at once. Scores (an hour of history, every
        # minute) and pool ages can wait for each partition's next cycle, which reads
        # them: waking every partition for them sent every listing to the cloud at the
        # same moment, once a minute (issue 26).
        if before is not None and (stamp[0] != before[0] or stamp[3] != before[3]):
            log.info("new exclusions or intents: every partition cycles now")
            self.on_signals()

    def _ages(self) -> None:
        ids = [p.id for p in self.pools]
        track_pool_ages(
            self.signals,
            ids,
            self.provider.headroom(ids),
            self.signals.live_per_pool(),
            self.clock.now(),
        )

    def _headroom(self) -> None:
        sample_headroom(
            self.provider, self.outbox, self.pools, self.clock.now(), self.config.headroom_every_s
        )

    # ------------------------------------------------------------ thread

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sco-pump", daemon=True)
            self._thread.start()

    def stop(self, flush: bool = True) -> None:
        """Stop, relaying what is left first (a clean shutdown leaves no backlog)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if flush and self.relay is not None:
            self._guard("relay", self._relay_all)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(min(self.config.relay_every_s, self.config.stamp_every_s))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
