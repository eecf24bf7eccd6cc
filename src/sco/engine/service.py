"""What every `sco` process serves besides its work: `/metrics`, `/healthz`, `/readyz`.

- `/metrics`: Prometheus text format, from the process's registry;
- `/healthz` (liveness): 200 while the process's loop is making progress,
  503 otherwise (an orchestrator restarts it);
- `/readyz` (readiness): 200 while it can do its work now (its database,
  broker or history reachable), 503 otherwise (it gets no traffic, and an
  operator sees why in the body).

A small threaded WSGI server, as prometheus_client's own: no framework for
three plain-text endpoints.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Check = Callable[[], tuple[bool, str]]  # (ok, why)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not worth a log line each."""


class HttpEndpoints:
    def __init__(
        self,
        registry: CollectorRegistry,
        live: Check = lambda: (True, "ok"),
        ready: Check = lambda: (True, "ok"),
    ) -> None:
        self._metrics = make_wsgi_app(registry)
        self.live = live
        self.ready = ready
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            ok, why = _safely(self.live if path == "/healthz" else self.ready)
            start(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8")],
            )
            return [f"{'ok' if ok else 'failing'}: {why}\n".encode()]
        if path == "/metrics":
            body: Iterable[bytes] = self._metrics(environ, start)
            return body
        start("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"sco: /metrics, /healthz, /readyz\n"]

    def serve(self, bind: str, port: int) -> int:
        """Listen in a thread of its own; returns the port (0 picks a free one)."""
        self._server = make_server(bind, port, self, _Server, handler_class=_Quiet)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sco-http", daemon=True
        )
        self._thread.start()
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _safely(check: Check) -> tuple[bool, str]:
    try:
        return check()
    except Exception as e:  # a probe must answer, whatever the check does
        return False, f"{type(e).__name__}: {e}"
