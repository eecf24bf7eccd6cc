"""What every long-running `sco` command is, around its work: one log format,
`/metrics` and health endpoints, and a clean stop on SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sco.apps import logs
from sco.apps.common import BadInput
from sco.apps.listen import name_process, refusal
from sco.assembly.http import Check, HttpEndpoints, endpoints
from sco.assembly.settings import Settings

log = logging.getLogger(__name__)
_PORT_KEYS = {"history-load": "history"}  # the http.*_port a component's port is


@dataclass
class Process:
    component: str
    registry: CollectorRegistry
    stop: threading.Event = field(default_factory=threading.Event)
    http: HttpEndpoints | None = None
    port: int | None = None

    def checks(self, live: Check, ready: Check) -> None:
        if self.http is not None:
            self.http.live, self.http.ready = live, ready


@contextmanager
def process(component: str, settings: Settings, port: int, verbose: int = 0) -> Iterator[Process]:
    """Logging set up, signals caught, `/metrics` + `/healthz` + `/readyz` served on
    `port` (0: not served) until the block ends."""
    level = "debug" if verbose >= 2 else ("info" if verbose == 1 else settings.log.level)
    logs.setup(component, level, settings.log.format)
    proc = Process(component, CollectorRegistry())
    name_process(proc.registry, component)
    _stop_on_signals(proc)
    if port:
        try:
            proc.http, proc.port = endpoints(proc.registry, settings.http.bind, port)
        except OSError as e:
            key = f"http.{_PORT_KEYS.get(component, component)}_port"
            raise BadInput(refusal(e, settings.http.bind, port, key, component)) from None
        log.info("%s: /metrics, /healthz and /readyz on :%d", component, proc.port)
    try:
        yield proc
    finally:
        if proc.http is not None:
            proc.http.close()


def _stop_on_signals(proc: Process) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("%s: signal %d, stopping", proc.component, signum)
        proc.stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
