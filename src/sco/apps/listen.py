"""Ports: a command that cannot listen where its configuration says refuses to start
(exit 2, as for any other configuration error), and says who holds the port when it
is another sco process: most often the same command started twice."""

from __future__ import annotations

import errno
import re
import socket
import urllib.request

from prometheus_client import CollectorRegistry, Info

from sco.apps.common import BadInput

_COMPONENT = re.compile(r'^sco_process_info\{component="([^"]+)"\}', re.M)


def name_process(registry: CollectorRegistry, component: str) -> None:
    """`sco_process_info{component=...}` on /metrics: who answers on a port."""
    Info("sco_process", "Which sco command this process is.", registry=registry).info(
        {"component": component}
    )


def listening(bind: str, port: int, key: str, component: str) -> socket.socket:
    """A socket bound and listening on bind:port for `sco <component>`; `key` is the
    setting that names the port. Raises BadInput saying why not."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT only
        sock.bind((bind, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise BadInput(refusal(e, bind, port, key, component)) from None
    return sock


def refusal(e: OSError, bind: str, port: int, key: str, component: str) -> str:
    """One line: the setting, the address, why, and who holds it if sco does."""
    said = f"{key}: cannot listen on {bind}:{port}: {(e.strerror or str(e)).lower()}"
    if e.errno != errno.EADDRINUSE:
        return said
    holder = holder_of(bind, port)
    if holder == component:
        return f"{said}: another sco {component} is already running on this port"
    if holder is not None:
        return f"{said}: sco {holder} listens there; give each sco process its own port"
    return f"{said} (by a program other than sco, or one that does not answer)"


def holder_of(bind: str, port: int) -> str | None:
    """The sco command answering on the port, if one does (its /metrics say)."""
    host = "127.0.0.1" if bind in ("", "0.0.0.0") else "::1" if bind == "::" else bind
    host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as r:
            text = r.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    found = _COMPONENT.search(text)
    return found.group(1) if found else None
