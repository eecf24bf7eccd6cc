"""One log format for every `sco` process.

`text`: `time level component logger: message`; `json`: one object per line
with `ts`, `level`, `component`, `logger`, `msg` (and `exc` with a
traceback), for a log pipeline. The component names the process (run, watch,
score, history-load), so lines from the whole control plane can be mixed.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import orjson

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR

# Warnings that differ only in their numbers (ports, milliseconds, counts) repeat;
# a number that is part of a name (p1, hpc-2, ipv4) makes another line.
_NUMBERS = re.compile(r"(?<![\w-])\d+")


class RepeatFilter(logging.Filter):
    """Let the first of a run of alike warnings through and hold the rest for `every_s`:
    a broker or an API that stays down for minutes is then a line a minute, not
    twenty a second (librdkafka retries every 50 ms, the outbox relay every 0.2 s),
    and the next line that passes says how many it stands for."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()  # handlers call filters outside their own lock

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, _NUMBERS.sub("#", record.getMessage()))
        with self._lock:
            now = self._clock()
            first, held = self._seen.get(key, (float("-inf"), 0))
            if now - first < self.every_s:
                self._seen[key] = (first, held + 1)
                return False
            if len(self._seen) > 10_000:
                self._forget(now)
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} like it in {now - first:.0f}s)"
            record.args = None
        return True

    def _forget(self, now: float) -> None:
        for key, (first, _) in list(self._seen.items()):
            if now - first >= self.every_s:
                del self._seen[key]


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def setup(component: str, level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once for this process (replacing what was there)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(component))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {component} %(name)s: %(message)s")
        )
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(level, logging.INFO))
    # Client libraries are chatty at INFO; their warnings still show.
    for noisy in (
        "openstack",
        "keystoneauth",
        "urllib3",
        "stevedore",
        "kubernetes",
        "httpx",
        "httpcore",
    ):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
