"""One log format for every `sco` process.

`text`: `time level component logger: message`; `json`: one object per line
with `ts`, `level`, `component`, `logger`, `msg` (and `exc` with a
traceback), for a log pipeline. The component names the process (run, watch,
score, history-load), so lines from the whole control plane can be mixed.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR


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
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(level, logging.INFO))
    # Client libraries are chatty at INFO; their warnings still show.
    for noisy in ("openstack", "keystoneauth", "urllib3", "stevedore", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
