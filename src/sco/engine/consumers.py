"""The loops of the signal processes (`sco watch`, `sco history load`, `sco score`):
consume a stream until stopped, backing off while it fails, and say whether the loop
is live and ready."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("sco.apps.signals")

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


def consume(
    component: str,
    stop: threading.Event,
    step: Callable[[], int],
    progress: Progress,
    on_idle: Callable[[], None] = lambda: None,
) -> None:
    """Call `step` until stopped; back off (doubling to 30 s) while it fails; wait a
    moment when it read nothing."""
    backoff = 1.0
    while not stop.is_set():
        try:
            n = step()
        except Exception as e:
            progress.failed(e)
            log.warning("%s: %s; retrying in %.0fs", component, progress.error, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        progress.ok()
        backoff = 1.0
        if not n:
            on_idle()
            stop.wait(IDLE_WAIT_S)
