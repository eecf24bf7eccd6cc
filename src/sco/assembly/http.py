"""What every long-running `sco` process serves besides its work (`/metrics`,
`/healthz`, `/readyz`: `sco.engine.service`), started for the commands."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sco.engine.service import Check, HttpEndpoints

__all__ = ["Check", "HttpEndpoints", "endpoints"]


def endpoints(registry: CollectorRegistry, bind: str, port: int) -> tuple[HttpEndpoints, int]:
    """The endpoints of `registry` served on `bind`:`port` (0: a free port), and the
    port they are on; OSError when it cannot be bound."""
    http = HttpEndpoints(registry)
    return http, http.serve(bind, port)
