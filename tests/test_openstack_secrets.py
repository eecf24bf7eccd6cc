"""Credentials from OpenBao through hvac, and their refresh before the lease ends.

No OpenBao server installs from this machine's registries, so the test
serves the four OpenBao HTTP endpoints hvac calls (token lookup and renewal,
AppRole login, KV v2 read) from a local HTTP server; hvac itself is real.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from sco.adapters.openstack import connect as connect_module
from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.secrets import OpenBaoConfig, OpenBaoSecrets
from sco.ports import Credential, PermanentProviderError, RetryableProviderError, Secret
from sco.runtime.clock import ManualClock

TOKEN = "s.bao-token-5c1e"
PASSWORD_V1 = "pw-first-77aa"
PASSWORD_V2 = "pw-rotated-88bb"


class _Bao(BaseHTTPRequestHandler):
    secret: ClassVar[dict[str, str]] = {}
    calls: ClassVar[list[str]] = []
    ttl: ClassVar[int] = 3600

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("X-Vault-Token") != TOKEN:
            self._send(403, {"errors": ["permission denied"]})
            return False
        return True

    def do_GET(self) -> None:
        self.calls.append(f"GET {self.path}")
        if not self._authorized():
            return
        if self.path == "/v1/auth/token/lookup-self":
            self._send(200, {"data": {"ttl": self.ttl, "renewable": True}})
        elif self.path == "/v1/secret/data/sco/openstack":
            self._send(200, {"data": {"data": dict(self.secret), "metadata": {"version": 1}}})
        else:
            self._send(404, {"errors": []})

    def do_POST(self) -> None:
        self.calls.append(f"POST {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/v1/auth/approle/login":
            if body.get("secret_id") != "approle-secret":
                self._send(400, {"errors": ["invalid secret id"]})
                return
            self._send(200, {"auth": {"client_token": TOKEN, "lease_duration": self.ttl}})
        elif self.path == "/v1/auth/token/renew-self":
            if self._authorized():
                self._send(200, {"auth": {"client_token": TOKEN, "lease_duration": self.ttl}})
        else:
            self._send(404, {"errors": []})


@pytest.fixture
def bao() -> Iterator[str]:
    _Bao.secret = {"username": "sco", "password": PASSWORD_V1}
    _Bao.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bao)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _config(url: str, **kw: Any) -> OpenBaoConfig:
    base: dict[str, Any] = {"url": url, "path": "sco/openstack", "token": Secret(TOKEN)}
    base.update(kw)
    return OpenBaoConfig(**base)


def test_reads_credential_and_refreshes_before_the_lease_ends(
    bao: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = ManualClock(1000.0)
    source = OpenBaoSecrets(_config(bao), clock)
    first = source.credential()
    assert first.revealed() == {"username": "sco", "password": PASSWORD_V1}
    assert first.expires_at == 1000.0 + 3600
    reads = len(_Bao.calls)
    clock.advance(2000)  # within 2/3 of the lease: cached
    assert source.credential() is first
    assert len(_Bao.calls) == reads
    _Bao.secret["password"] = PASSWORD_V2  # rotated in OpenBao
    clock.advance(500)  # past 2/3 of the lease, before its end
    second = source.credential()
    assert second.revealed()["password"] == PASSWORD_V2
    assert "POST /v1/auth/token/renew-self" in _Bao.calls
    for secret in (TOKEN, PASSWORD_V1, PASSWORD_V2):
        assert secret not in caplog.text
        assert secret not in repr(second)


def test_approle_login(bao: str) -> None:
    source = OpenBaoSecrets(
        _config(bao, token=None, role_id="sco", secret_id=Secret("approle-secret")),
        ManualClock(0),
    )
    assert source.credential().revealed()["password"] == PASSWORD_V1
    assert _Bao.calls[0] == "POST /v1/auth/approle/login"


def test_refused_token_error_does_not_quote_it(bao: str) -> None:
    source = OpenBaoSecrets(_config(bao, token=Secret("s.wrong-token-0000")), ManualClock(0))
    with pytest.raises(RetryableProviderError) as info:
        source.credential()
    assert "wrong-token" not in str(info.value)
    assert "Forbidden" in str(info.value)


def test_empty_secret_is_a_permanent_error(bao: str) -> None:
    _Bao.secret = {}
    with pytest.raises(PermanentProviderError, match="holds no fields"):
        OpenBaoSecrets(_config(bao), ManualClock(0)).credential()


def test_config_needs_a_way_in() -> None:
    with pytest.raises(ValueError, match="token, or an AppRole"):
        OpenBaoConfig(url="http://x", path="p")


class _Rotating:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.reads = 0

    def credential(self) -> Credential:
        self.reads += 1
        return Credential(
            fields={"token": Secret(f"tok-{self.reads}")}, expires_at=self.clock.now() + 3600
        )


def test_sessions_rebuild_the_connection_before_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    class _Conn:
        def __init__(self, token: str) -> None:
            self.compute = f"compute-with-{token}"

    def fake_connect(
        cloud: str, credential: Credential, timeout: float, clouds_file: str | None = None
    ) -> Any:
        token = credential.revealed()["token"]
        built.append(token)
        return _Conn(token)

    monkeypatch.setattr(connect_module, "connect", fake_connect)
    clock = ManualClock(0)
    source = _Rotating(clock)
    sessions = CloudSessions("lab", source, clock)
    assert sessions("compute") == "compute-with-tok-1"
    clock.advance(3000)  # not yet within 5 minutes of expiry
    assert sessions("compute") == "compute-with-tok-1"
    clock.advance(400)  # now within
    assert sessions("compute") == "compute-with-tok-2"
    assert built == ["tok-1", "tok-2"]
