"""The distributor's HTTP API under arbitrary input, from its OpenAPI schema's
operations: whatever a client sends, the answer is never a 5xx."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.distributor import DistributorConfig, create_app
from sco.domain.contracts import token_digest
from sco.domain.instances import created
from sco.domain.lifecycle import State
from sco_harness.builders import instance, spot_pool

POOL = spot_pool(zone="a")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    store = SqlFleetStore(sqlite_url(Path(tmp_path_factory.mktemp("fuzz")) / "f.db"))
    store.upsert_pools([POOL])
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    token = secrets.token_urlsafe(32)
    store.contracts.set_token(inst.id, token_digest(token), time.time() + 3600, time.time())
    # Limits high enough that the fuzzing itself is not what answers.
    app = create_app(
        store.contracts, DistributorConfig(auth_failures_per_min=1e9, requests_per_s=1e9)
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, token
    store.close()


def test_the_schema_names_both_operations(world: tuple[TestClient, str]) -> None:
    client, _ = world
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/contract"]) == {"get"}
    assert set(paths["/v1/contract/ack"]) == {"post"}


text = st.text(max_size=80)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=10,
)


def _auth(token: str) -> st.SearchStrategy[str | None]:
    return st.one_of(
        st.none(),
        st.just(f"Bearer {token}"),
        text.map(lambda t: f"Bearer {t}"),
        text,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)  # fmt: skip
@given(data=st.data())
def test_get_never_answers_5xx(world: tuple[TestClient, str], data: st.DataObject) -> None:
    client, token = world
    headers: dict[str, str] = {}
    auth = data.draw(_auth(token))
    if auth is not None:
        headers["Authorization"] = auth
    if data.draw(st.booleans()):
        headers["If-None-Match"] = data.draw(st.one_of(text, st.just('"1"'), st.just('W/"1"')))
    params: dict[str, Any] = {}
    if data.draw(st.booleans()):
        params["wait"] = data.draw(st.one_of(text, st.floats(-10, 0.05), st.just("nan")))
    # Any byte a header can carry (httpx sends str headers as ASCII only).
    raw = {k: v.encode("latin-1", "replace") for k, v in headers.items()}
    r = client.get("/v1/contract", headers=raw, params=params)
    assert r.status_code < 500, (headers, params, r.text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)  # fmt: skip
@given(data=st.data())
def test_ack_never_answers_5xx(world: tuple[TestClient, str], data: st.DataObject) -> None:
    client, token = world
    auth = data.draw(_auth(token))
    headers = {"Authorization": auth.encode("latin-1", "replace")} if auth else {}
    body = data.draw(
        st.one_of(
            json_values,
            st.fixed_dictionaries(
                {"version": st.integers(-5, 5) | text, "status": st.sampled_from(
                    ["drained", "left", "failed", "x"]), "detail": text | st.integers()},
            ),
        )
    )  # fmt: skip
    r = client.post("/v1/contract/ack", headers=headers, json=body)
    assert r.status_code < 500, (headers, body, r.text)
    raw = data.draw(st.binary(max_size=200))
    r = client.post("/v1/contract/ack", headers=headers, content=raw)
    assert r.status_code < 500, (headers, raw, r.text)


def test_a_body_that_is_not_text_is_a_documented_400(world: tuple[TestClient, str]) -> None:
    """Regression (bench/fuzz.py with schemathesis, issue 17): FastAPI refuses a body of
    bytes that are not UTF-8 with 400 before validation, which the schema did not name."""
    client, token = world
    r = client.post(
        "/v1/contract/ack",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        content=b"\x0e\x0f\xff[\xfe",
    )
    assert r.status_code == 400
    documented = client.get("/openapi.json").json()["paths"]["/v1/contract/ack"]["post"]
    assert "400" in documented["responses"]
