"""A stand-in OpenBao for tests: the four HTTP endpoints hvac calls for sco.

No OpenBao (or Vault) server installs from this machine's registries, so this
serves what `sco.adapters.openstack.secrets.OpenBaoSecrets` asks of one, with
OpenBao's request and answer shapes: token lookup and renewal, AppRole login,
and a KV v2 read. hvac itself is real.

`down()` makes it unreachable as a dead server behind a load balancer is: each
connection is accepted and reset at once, so hvac sees a connection error, and
every such attempt is counted (`refused_at`); `up()` serves again on the same
address.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

APPROLE_SECRET = "approle-secret"


class FakeBao:
    """`token`: the token it accepts; `secret`: the fields at `mount`/`path` (KV v2);
    `ttl_s`: the lease it reports for the token and for an AppRole login."""

    def __init__(
        self,
        token: str,
        secret: dict[str, str],
        *,
        ttl_s: int = 3600,
        path: str = "sco/openstack",
        mount: str = "secret",
    ) -> None:
        self.token = token
        self.secret = secret
        self.ttl_s = ttl_s
        self.path = path
        self.mount = mount
        self.calls: list[str] = []  # "GET /v1/...", answered
        self.reads_at: list[float] = []  # when the secret was read (KV v2)
        self.refused_at: list[float] = []  # attempts while down
        self.is_down = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeBao:
        bao = self

        class Handler(_Handler):
            owner = bao

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        self.is_down = True

    def up(self) -> None:
        self.is_down = False

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    owner: FakeBao

    def log_message(self, *args: Any) -> None:
        pass

    def handle(self) -> None:
        if self.owner.is_down:
            self.owner.refused_at.append(time.time())
            # Reset, not a polite close: what a client sees of a server that is gone.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        super().handle()

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("X-Vault-Token") != self.owner.token:
            self._send(403, {"errors": ["permission denied"]})
            return False
        return True

    def do_GET(self) -> None:
        bao = self.owner
        bao.calls.append(f"GET {self.path}")
        if not self._authorized():
            return
        if self.path == "/v1/auth/token/lookup-self":
            self._send(200, {"data": {"ttl": bao.ttl_s, "renewable": True}})
        elif self.path == f"/v1/{bao.mount}/data/{bao.path}":
            bao.reads_at.append(time.time())
            self._send(200, {"data": {"data": dict(bao.secret), "metadata": {"version": 1}}})
        else:
            self._send(404, {"errors": []})

    def do_POST(self) -> None:
        bao = self.owner
        bao.calls.append(f"POST {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/v1/auth/approle/login":
            if body.get("secret_id") != APPROLE_SECRET:
                self._send(400, {"errors": ["invalid secret id"]})
                return
            self._send(200, {"auth": {"client_token": bao.token, "lease_duration": bao.ttl_s}})
        elif self.path == "/v1/auth/token/renew-self":
            if self._authorized():
                self._send(200, {"auth": {"client_token": bao.token, "lease_duration": bao.ttl_s}})
        else:
            self._send(404, {"errors": []})
