"""The fault proxy the fault matrix puts between sco and a service."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sco_harness.faults.proxy import FaultProxy


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = FaultProxy(("127.0.0.1", server.server_address[1])).start()
    yield p
    p.stop()
    server.shutdown()


def _get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/")
    r = conn.getresponse()
    r.read()
    return r.status


def test_modes_switch_on_open_and_new_connections(proxy: FaultProxy) -> None:
    kept = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    assert _get(kept) == 200
    proxy.set("error")
    assert _get(kept) == 503  # an open keep-alive connection gets the storm too
    assert _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)) == 503
    proxy.set("slow", delay_s=0.2)
    assert _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)) == 200
    proxy.set("refuse")
    with pytest.raises(ConnectionRefusedError):
        _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5))
    proxy.set("pass")
    assert _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)) == 200


def test_refuse_cuts_open_connections(proxy: FaultProxy) -> None:
    kept = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    assert _get(kept) == 200
    proxy.set("refuse")
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected, OSError)):
        _get(kept)
