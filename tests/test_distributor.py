"""The contract distributor over a real fleet state (SQLite, and PostgreSQL with
LISTEN/NOTIFY): tokens, long polls, acknowledgements, rate limits, and no token in
any log line or row."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.distributor import DistributorConfig, create_app
from sco.domain.contracts import token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.engine.admission import Buckets
from sco.engine.distributor import ChangeFeed
from sco.ports import Contracts, ContractsUnavailable
from sco_harness.builders import instance, spot_pool

POOL = spot_pool(zone="a")


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(fleet_url)
    _: Contracts = s.contracts  # mypy holds the SQL adapter to every role of the port
    s.upsert_pools([POOL])
    yield s
    s.close()


def _node(store: SqlFleetStore, expires_at: float | None = None) -> tuple[Instance, str]:
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    token = secrets.token_urlsafe(32)
    store.contracts.set_token(
        inst.id, token_digest(token), expires_at or time.time() + 3600, time.time() - 3600
    )
    return inst, token


def _client(store: SqlFleetStore, **config: Any) -> TestClient:
    app = create_app(
        store.contracts, DistributorConfig(**config), listen=store.contracts.listener()
    )
    return TestClient(app)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_node_reads_only_its_own_contract_and_others_are_unknown(store: SqlFleetStore) -> None:
    a, token_a = _node(store)
    _b, _token_b = _node(store)
    _c, expired = _node(store, expires_at=time.time() - 1)
    with _client(store) as client:
        r = client.get("/v1/contract", headers=_auth(token_a))
        assert r.status_code == 200
        assert r.json()["instance_id"] == a.id
        assert r.json()["state"] == "serving"
        assert r.headers["ETag"] == '"1"'
        refused = [
            client.get("/v1/contract"),
            client.get("/v1/contract", headers=_auth(secrets.token_urlsafe(32))),
            client.get("/v1/contract", headers=_auth(expired)),
            client.get("/v1/contract", headers={"Authorization": f"Basic {token_a}"}),
        ]
        assert {r.status_code for r in refused} == {401}
        assert len({r.text for r in refused}) == 1, "every refusal reads the same"
        assert client.get("/openapi.json").json()["paths"].keys() >= {
            "/v1/contract",
            "/v1/contract/ack",
        }


def test_a_long_poll_answers_as_soon_as_the_contract_changes(store: SqlFleetStore) -> None:
    inst, token = _node(store)
    # Without NOTIFY (SQLite) a replica looks every poll_s; with it (PostgreSQL) the
    # NOTIFY wakes it: a poll_s longer than the wait proves that.
    poll_s = 60.0 if store.engine.dialect.name == "postgresql" else 0.2
    with _client(store, poll_s=poll_s) as client:
        h = _auth(token) | {"If-None-Match": '"1"'}
        assert client.get("/v1/contract", headers=h).status_code == 304
        assert client.get("/v1/contract?wait=0.5", headers=h).status_code == 304
        time.sleep(0.5)  # the feed has read where the change log stands

        def notice() -> None:
            time.sleep(1.0)
            store.record([step(inst, Trigger.RECLAIM_NOTICE, 10.0, "n", notice_deadline=99.0)])

        threading.Thread(target=notice).start()
        r = client.get("/v1/contract?wait=20", headers=h)
        assert r.status_code == 200
        assert r.headers["ETag"] == '"2"'
        assert (r.json()["state"], r.json()["drain_by"]) == ("leaving", 99.0)
        metrics = client.get("/metrics").text
        assert 'sco_distributor_requests_total{code="304",route="contract"} 2.0' in metrics


def test_acks_name_the_current_version(store: SqlFleetStore) -> None:
    inst, token = _node(store)
    with _client(store) as client:
        ok = client.post(
            "/v1/contract/ack",
            headers=_auth(token),
            json={"version": 1, "status": "drained", "detail": "2 jobs requeued"},
        )
        assert ok.status_code == 200
        stale = client.post(
            "/v1/contract/ack", headers=_auth(token), json={"version": 3, "status": "drained"}
        )
        assert stale.status_code == 409
        bad = client.post(
            "/v1/contract/ack", headers=_auth(token), json={"version": 1, "status": "maybe"}
        )
        assert bad.status_code == 422
    c = store.contracts.get(inst.id)
    assert c is not None
    assert (c.ack_version, str(c.ack_status), c.ack_detail) == (1, "drained", "2 jobs requeued")


def test_guessing_tokens_is_limited_per_client(store: SqlFleetStore) -> None:
    _inst, _token = _node(store)
    with _client(store, auth_failures_per_min=5) as client:
        codes = [
            client.get("/v1/contract", headers=_auth(secrets.token_urlsafe(32))).status_code
            for _ in range(8)
        ]
        assert codes[:5] == [401] * 5
        assert set(codes[5:]) == {429}
        metrics = client.get("/metrics").text
        assert "sco_distributor_auth_failures_total 8.0" in metrics, "every bad token counted"
        assert 'sco_distributor_rate_limited_total{limit="auth_failures"} 3.0' in metrics


def test_a_valid_token_is_served_from_an_address_over_the_failure_limit(
    store: SqlFleetStore,
) -> None:
    """Regression (issue 25, item 7): the address's failure limit was checked before
    the token, so after a token rotation behind a NAT (many agents, one address,
    some still holding the old token) every agent there got 429, valid token or not."""
    _inst, token = _node(store)
    with _client(store, auth_failures_per_min=5) as client:
        stale = [client.get("/v1/contract", headers=_auth(secrets.token_urlsafe(32)))
                 for _ in range(5)]  # fmt: skip
        assert [r.status_code for r in stale] == [401] * 5
        assert all(r.headers["WWW-Authenticate"] == "Bearer" for r in stale)
        assert client.get("/v1/contract", headers=_auth(token)).status_code == 200
        over = client.get("/v1/contract", headers=_auth(secrets.token_urlsafe(32)))
        assert over.status_code == 429
        assert over.headers["Retry-After"] == "60"
        assert "invalid_token" in over.headers["WWW-Authenticate"]
        assert client.get("/v1/contract", headers=_auth(token)).status_code == 200
        metrics = client.get("/metrics").text
    assert "sco_distributor_auth_failures_total 6.0" in metrics
    assert 'sco_distributor_rate_limited_total{limit="auth_failures"} 1.0' in metrics
    assert 'sco_distributor_requests_total{code="200",route="contract"} 2.0' in metrics


class _HeldCopy:
    """Fleet state's contracts, but the replica's first copy waits for `release`."""

    def __init__(self, store: SqlFleetStore) -> None:
        self._contracts = store.contracts
        self.release = threading.Event()

    def current(self, gone_since: float) -> object:
        self.release.wait(30)
        return self._contracts.current(gone_since)

    def __getattr__(self, name: str) -> object:
        return getattr(self._contracts, name)


def test_a_valid_token_is_served_over_the_failure_limit_before_the_copy_is_filled(
    store: SqlFleetStore,
) -> None:
    """Regression (found by CI on PostgreSQL): a replica starting had not filled its
    copy yet, so a valid token was missing from it and, from an address over its
    failure limit, refused with 429 without asking fleet state."""
    _inst, token = _node(store)
    held = _HeldCopy(store)
    config = DistributorConfig(auth_failures_per_min=5)
    app = create_app(held, config, listen=store.contracts.listener())  # type: ignore[arg-type]
    try:
        with TestClient(app) as client:
            stale = [client.get("/v1/contract", headers=_auth(secrets.token_urlsafe(32)))
                     for _ in range(6)]  # fmt: skip
            assert [r.status_code for r in stale] == [401] * 5 + [429]
            assert client.get("/readyz").status_code == 503, "the copy is still held"
            assert client.get("/v1/contract", headers=_auth(token)).status_code == 200
            held.release.set()
    finally:
        held.release.set()


def test_a_node_that_polls_too_often_is_slowed(store: SqlFleetStore) -> None:
    _inst, token = _node(store)
    with _client(store, requests_per_s=1.0) as client:
        codes = [client.get("/v1/contract", headers=_auth(token)).status_code for _ in range(8)]
    assert codes[:4] == [200] * 4
    assert 429 in codes[4:]


def test_no_token_in_logs_or_rows(store: SqlFleetStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _inst, canary = _node(store)
    with _client(store) as client:
        client.get("/v1/contract", headers=_auth(canary))
        client.post(
            "/v1/contract/ack", headers=_auth(canary), json={"version": 1, "status": "left"}
        )
        client.get("/v1/contract", headers=_auth(canary + "x"))
    assert canary not in caplog.text
    assert token_digest(canary) not in caplog.text
    with store.engine.connect() as conn:
        for table in ("contracts", "instance_history", "outbox"):
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                assert canary not in " ".join(str(v) for v in row)


def test_a_node_never_sees_its_contract_go_back(store: SqlFleetStore) -> None:
    """Regression (issue 25, found by a loaded CI run): a token not yet in the copy
    was served from fleet state (version 2, leave), then the feed applied a read
    that began before the notice (version 1, serve), and the node's next poll saw
    its contract go back, which reset the agent's drain retries."""
    inst, token = _node(store)
    v1 = store.contracts.get(inst.id)
    store.record([step(inst, Trigger.RECLAIM_NOTICE, 10.0, "n", notice_deadline=4e9)])
    v2 = store.contracts.get(inst.id)
    assert v1 is not None
    assert v2 is not None
    assert v2.version > v1.version
    feed = ChangeFeed(store.contracts, poll_s=1.0)
    feed.learn(v2)  # a request read it from fleet state itself
    feed.mirror.apply([v1], now=time.time())  # the feed's older read lands after
    served = feed.mirror.by_digest(token_digest(token), time.time())
    assert served is not None
    assert (served.version, str(served.terms.state)) == (v2.version, "leaving")


def test_buckets_refill_at_their_rate() -> None:
    now = [0.0]
    b = Buckets(rate=1.0, burst=2.0, clock=lambda: now[0])
    assert [b.take("k") for _ in range(3)] == [True, True, False]
    now[0] = 1.0
    assert b.take("k")
    assert not b.take("k")
    assert b.take("other")


def test_a_body_that_is_not_utf8_is_refused_not_a_crash(store: SqlFleetStore) -> None:
    # Found by fuzzing: FastAPI's own validation handler echoed the body and failed (500).
    _inst, token = _node(store)
    with TestClient(create_app(store.contracts, DistributorConfig())) as client:
        r = client.post("/v1/contract/ack", headers=_auth(token), content=b"\x80")
    assert r.status_code == 422
    assert "\\x80" not in r.text


def test_a_version_past_64_bits_is_refused_not_a_crash(store: SqlFleetStore) -> None:
    # Found by bench/fuzz.py (issue 17): SQLite's OverflowError answered 500.
    _inst, token = _node(store)
    with TestClient(create_app(store.contracts, DistributorConfig())) as client:
        r = client.post(
            "/v1/contract/ack", headers=_auth(token), json={"version": 2**63, "status": "left"}
        )
        assert r.status_code == 422
        # An ETag of digits that are not ASCII ("²") is no version: a plain read.
        assert (
            client.get(
                "/v1/contract", headers=_auth(token) | {"If-None-Match": '"²"'.encode()}
            ).status_code
            == 200
        )


def test_with_fleet_state_away_reads_go_on_and_acks_wait(
    store: SqlFleetStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _inst, token = _node(store)
    with _client(store, poll_s=0.05) as client:
        assert client.get("/v1/contract", headers=_auth(token)).status_code == 200

        # Fleet state goes away under the adapter: a database it cannot open.
        away = create_engine(f"sqlite:///{tmp_path}/no/such/folder/state.sqlite")
        monkeypatch.setattr(store.contracts, "engine", away)
        # The feed notices (however loaded the machine: waited for, not slept on).
        deadline = time.monotonic() + 60
        while "unreachable" not in client.get("/readyz").text and time.monotonic() < deadline:
            time.sleep(0.05)
        r = client.get("/v1/contract", headers=_auth(token))
        assert r.status_code == 200, "the last known contract, from the replica's copy"
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert "unreachable" in ready.text
        ack = client.post(
            "/v1/contract/ack", headers=_auth(token), json={"version": 1, "status": "left"}
        )
        assert ack.status_code == 503
        assert ack.headers["Retry-After"] == "5"


def test_fleet_state_away_is_the_ports_error_and_names_no_digest(
    store: SqlFleetStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    digest = token_digest(secrets.token_urlsafe(32))
    away = create_engine(f"sqlite:///{tmp_path}/no/such/folder/state.sqlite")
    monkeypatch.setattr(store.contracts, "engine", away)
    with pytest.raises(ContractsUnavailable) as failed:
        store.contracts.by_token(digest, time.time())
    assert "OperationalError" in str(failed.value)
    assert digest not in str(failed.value)


class _QuietContracts:
    """Fleet state with nothing in it, answering at once."""

    def last_change(self) -> int:
        return 0

    def current(self, _gone_since: float) -> list[Any]:
        return []

    def changed_since(self, last: int) -> tuple[int, set[str]]:
        return last, set()

    def get_many(self, _ids: list[str]) -> dict[str, Any]:
        return {}

    def prune_changes(self, _before: float) -> int:
        return 0


def test_the_change_feed_stops_when_cancelled_as_a_poke_arrives() -> None:
    """Found by a CI run that hung 600 s in the app's shutdown: on Python 3.11,
    asyncio.wait_for returns the inner result, swallowing the cancellation, when both
    come in the same loop tick, and the feed went on forever."""

    async def scenario() -> list[int]:
        stuck = []
        for k in range(50):
            feed = ChangeFeed(_QuietContracts(), poll_s=30.0)  # type: ignore[arg-type]
            task = asyncio.create_task(feed.run())
            while not feed.loaded:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.005)  # parked, waiting for a poke
            feed.poke()
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2.0)
            if task not in done:
                stuck.append(k)
                task.cancel()
        return stuck

    assert asyncio.run(scenario()) == []
