"""Credentials from OpenBao through hvac, and their refresh before the lease ends.

No OpenBao server installs from this machine's registries, so the tests run
against `sco_harness.openbao.FakeBao`: the four OpenBao HTTP endpoints hvac
calls (token lookup and renewal, AppRole login, KV v2 read); hvac itself is
real.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from sco.adapters.openstack import connect as connect_module
from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.secrets import OpenBaoConfig, OpenBaoSecrets
from sco.engine.clock import ManualClock
from sco.ports import Credential, PermanentProviderError, RetryableProviderError, Secret
from sco_harness.openbao import APPROLE_SECRET, FakeBao

TOKEN = "s.bao-token-5c1e"
PASSWORD_V1 = "pw-first-77aa"
PASSWORD_V2 = "pw-rotated-88bb"


@pytest.fixture
def bao() -> Iterator[FakeBao]:
    server = FakeBao(TOKEN, {"username": "sco", "password": PASSWORD_V1}).start()
    yield server
    server.stop()


def _config(bao: FakeBao, **kw: Any) -> OpenBaoConfig:
    base: dict[str, Any] = {"url": bao.url, "path": "sco/openstack", "token": Secret(TOKEN)}
    base.update(kw)
    return OpenBaoConfig(**base)


def test_reads_credential_and_refreshes_before_the_lease_ends(
    bao: FakeBao, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = ManualClock(1000.0)
    source = OpenBaoSecrets(_config(bao), clock)
    first = source.credential()
    assert first.revealed() == {"username": "sco", "password": PASSWORD_V1}
    assert first.expires_at == 1000.0 + 3600
    reads = len(bao.calls)
    clock.advance(2000)  # within 2/3 of the lease: cached
    assert source.credential() is first
    assert len(bao.calls) == reads
    bao.secret["password"] = PASSWORD_V2  # rotated in OpenBao
    clock.advance(500)  # past 2/3 of the lease, before its end
    second = source.credential()
    assert second.revealed()["password"] == PASSWORD_V2
    assert "POST /v1/auth/token/renew-self" in bao.calls
    for secret in (TOKEN, PASSWORD_V1, PASSWORD_V2):
        assert secret not in caplog.text
        assert secret not in repr(second)


def test_openbao_away_at_refresh_keeps_the_valid_credential_and_backs_off(
    bao: FakeBao, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (fault matrix, issue 17): OpenBao unreachable at the refresh made
    `credential()` raise at once, though the credential read before had a third of
    its lease left, and every API call asked OpenBao again. Now the cached credential
    serves until it expires, OpenBao is asked after a backoff, and only an expired
    credential raises, saying so."""
    bao.ttl_s = 20
    clock = ManualClock(1000.0)
    source = OpenBaoSecrets(_config(bao), clock)
    first = source.credential()
    assert first.expires_at == 1020.0
    bao.down()
    clock.advance(14)  # past 2/3 of the lease: a refresh is due, OpenBao is away
    assert source.credential() is first
    assert len(bao.refused_at) == 1
    for _ in range(10):  # calls within the backoff do not ask OpenBao again
        clock.advance(0.05)
        assert source.credential() is first
    assert len(bao.refused_at) == 1
    assert "stays valid 6 s more" in caplog.text
    clock.advance(1.0)  # the backoff (1 s) is over: asked again, still away
    assert source.credential() is first
    assert len(bao.refused_at) == 2
    clock.advance(6)  # 1021: expired, and OpenBao is still away
    with pytest.raises(RetryableProviderError, match="expired 1 s ago and no new one came"):
        source.credential()
    tries = len(bao.refused_at)
    for _ in range(20):
        clock.advance(0.1)
        with pytest.raises(RetryableProviderError):
            source.credential()
    assert len(bao.refused_at) <= tries + 1, "backed off, not asked on every call"
    bao.up()
    clock.advance(10)  # the longest backoff
    fresh = source.credential()
    assert fresh is not first
    assert fresh.expires_at == clock.now() + 20
    assert TOKEN not in caplog.text


def test_openbao_backoff_doubles_up_to_its_cap(bao: FakeBao) -> None:
    bao.ttl_s = 20
    clock = ManualClock(0.0)
    source = OpenBaoSecrets(_config(bao, retry_s=1.0, retry_max_s=4.0), clock)
    source.credential()
    bao.down()
    clock.advance(20)
    tried_at: list[float] = []
    for _ in range(300):  # 30 s, a call every 0.1 s
        before = len(bao.refused_at)
        with pytest.raises(RetryableProviderError):
            source.credential()
        if len(bao.refused_at) > before:
            tried_at.append(clock.now())
        clock.advance(0.1)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(tried_at)]
    assert gaps[:3] == [1.0, 2.0, 4.0]
    assert set(gaps[3:]) == {4.0}


def test_approle_login(bao: FakeBao) -> None:
    source = OpenBaoSecrets(
        _config(bao, token=None, role_id="sco", secret_id=Secret(APPROLE_SECRET)),
        ManualClock(0),
    )
    assert source.credential().revealed()["password"] == PASSWORD_V1
    assert bao.calls[0] == "POST /v1/auth/approle/login"


def test_refused_token_error_does_not_quote_it(bao: FakeBao) -> None:
    source = OpenBaoSecrets(_config(bao, token=Secret("s.wrong-token-0000")), ManualClock(0))
    with pytest.raises(RetryableProviderError) as info:
        source.credential()
    assert "wrong-token" not in str(info.value)
    assert "Forbidden" in str(info.value)


def test_empty_secret_is_a_permanent_error(bao: FakeBao) -> None:
    bao.secret = {}
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
