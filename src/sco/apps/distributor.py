"""The contract distributor: each node reads its own contract, and long-polls for the
next version; its agent acknowledges a drain. Stateless over fleet state: run as
many replicas as wanted behind one service.

- `GET /v1/contract` (`Authorization: Bearer <node token>`): the node's contract
  and its ETag (the version). With `If-None-Match` and `?wait=S`, the answer
  waits up to S seconds for a newer version: 304 at the timeout.
- `POST /v1/contract/ack`: `{version, status: drained|left|failed, detail}`;
  409 when the version is no longer the current one (read it again).
- `/healthz`, `/readyz`, `/metrics`, and the OpenAPI schema at `/openapi.json`.

Tokens are looked up by their SHA-256; a token reads only its own contract (no
request names an instance), and an unknown or expired one gets the same 401.
Failed authentications are limited per client address, requests per token; a
valid token is served whatever its address's failures (`sco.engine.admission`).
Neither a token nor its digest is ever logged or exported.

Each replica keeps a copy of the contracts (loaded at start, then kept current
from `contract_changes`: on PostgreSQL a NOTIFY in the writing transaction wakes
it, on SQLite it looks every `poll_s`) and answers reads and long polls from it.
A change wakes exactly the requests waiting on that contract. With fleet state
away, a replica stays ready and goes on answering with what it knows (its
/readyz says so); acknowledgements need fleet state and get 503 meanwhile.

This module is the HTTP side only (routes, models, metrics, refusals); the copy,
its change feed and the long poll are `sco.engine.distributor`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NoReturn

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from sco.apps.listen import name_process
from sco.domain.contracts import AckStatus, StoredContract, token_digest
from sco.engine.admission import Admission
from sco.engine.distributor import ChangeFeed, contract_of
from sco.ports import ContractFeed, ContractsUnavailable, Listener

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Ack(BaseModel):
    # No version of ours reaches 2**53: past it, a JSON number is not exact in every
    # client (nor in a schema validator), and past 64 bits the database cannot hold it.
    version: int = Field(ge=1, le=2**53, description="The contract version this answers.")
    status: Literal["drained", "left", "failed"]
    detail: str = Field(default="", max_length=2000, description="What the agent did.")


class ContractOut(BaseModel):
    instance_id: str
    version: int
    partition: str
    pool: str
    capacity_class: str
    plan_generation: int
    state: Literal["joining", "serving", "leaving", "gone"]
    drain_by: float | None = Field(description="Out of its scheduler by then (Unix time).")
    reclaim: bool = Field(
        description="Leaving because the cloud takes it back: work may be cut short "
        "(requeued) to leave in time. Otherwise (sco's own moves) only drain."
    )
    join: str = Field(description="How to join its scheduler; never a secret.")
    lease_expires_at: float = Field(
        description="Trust this contract until then without hearing from the distributor."
    )


class AckOut(BaseModel):
    accepted: bool
    version: int


@dataclass
class DistributorConfig:
    max_wait_s: float = 60.0
    poll_s: float = 0.25
    lease_s: float = 300.0
    auth_failures_per_min: float = 30.0
    requests_per_s: float = 5.0
    join: Callable[[str], str] = lambda _partition: ""


@dataclass
class _Metrics:
    registry: CollectorRegistry
    requests: Counter = field(init=False)
    auth_failures: Counter = field(init=False)
    limited: Counter = field(init=False)
    waiting: Gauge = field(init=False)
    acks: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "sco_distributor_requests_total", "Requests by route and status code.",
            ["route", "code"], registry=r,
        )  # fmt: skip
        self.auth_failures = Counter(
            "sco_distributor_auth_failures_total", "Requests with no valid node token.",
            registry=r,
        )  # fmt: skip
        self.limited = Counter(
            "sco_distributor_rate_limited_total", "Requests refused by a rate limit (429).",
            ["limit"], registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "sco_distributor_waiting", "Long polls waiting for a contract change.", registry=r
        )
        self.acks = Counter(
            "sco_distributor_acks_total", "Acknowledgements by status.", ["status"], registry=r
        )


def _etag(version: int) -> str:
    return f'"{version}"'


def _version_of(if_none_match: str | None) -> int | None:
    if not if_none_match:
        return None
    text = if_none_match.strip().removeprefix("W/").strip('"')
    return int(text) if text.isascii() and text.isdigit() else None


def create_app(
    contracts: ContractFeed,
    config: DistributorConfig,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.time,
    listen: Listener | None = None,
) -> FastAPI:
    """The distributor's ASGI app over `contracts`. With `listen` (fleet state on
    PostgreSQL: `contracts.listener()`) it hears of changes as they commit; otherwise
    it polls every `config.poll_s`."""
    metrics = _Metrics(registry or CollectorRegistry())
    name_process(metrics.registry, "distributor")
    admission = Admission(config.auth_failures_per_min, config.requests_per_s)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        feed = ChangeFeed(contracts, config.poll_s)
        state["feed"] = feed
        async with feed.following(listen):
            yield

    app = FastAPI(
        title="sco contract distributor",
        version="1",
        description="Each node's contract: where it belongs and when it must leave.",
        lifespan=lifespan,
    )

    def refuse(route: str, code: int, why: str, headers: dict[str, str] | None = None) -> NoReturn:
        metrics.requests.labels(route, str(code)).inc()
        raise HTTPException(code, why, headers=headers)

    async def authenticate(
        request: Request, route: str, authorization: str | None
    ) -> StoredContract:
        client = request.client.host if request.client else "?"
        scheme, _, token = (authorization or "").partition(" ")
        row = None
        if scheme.lower() == "bearer" and 20 <= len(token.strip()) <= 200:
            feed: ChangeFeed = state["feed"]
            # From this replica's copy; from fleet state when the copy may be a moment
            # behind (a token just issued: the address's failures allowing) or is not
            # filled yet (a replica starting, whatever the address's failures).
            row = await feed.find(
                token_digest(token.strip()), clock(), lambda: admission.may_look_further(client)
            )
        no = admission.admit(client, row.instance_id if row is not None else None)
        if no is not None:
            if no.failed_auth:
                metrics.auth_failures.inc()
            if no.limit is not None:
                metrics.limited.labels(no.limit).inc()
            refuse(route, no.code, no.why, dict(no.headers))
        assert row is not None
        return row

    def body(row: StoredContract) -> dict[str, Any]:
        join = config.join(row.terms.partition)
        return contract_of(row, join, clock() + config.lease_s).as_json()

    @app.get(
        "/v1/contract",
        response_model=ContractOut,
        responses={304: {"description": "No newer version within `wait`."}, 401: {}, 429: {}},
    )
    async def get_contract(
        request: Request,
        authorization: Annotated[str | None, Header()] = None,
        if_none_match: Annotated[str | None, Header()] = None,
        wait: Annotated[float, Query(ge=0, le=300, description="Seconds to wait.")] = 0.0,
    ) -> Response:
        row = await authenticate(request, "contract", authorization)
        known = _version_of(if_none_match)
        if known is not None and known == row.version and wait > 0:
            row = await _wait(row, known, min(wait, config.max_wait_s))
        if known is not None and known == row.version:
            metrics.requests.labels("contract", "304").inc()
            return Response(status_code=304, headers={"ETag": _etag(row.version)})
        metrics.requests.labels("contract", "200").inc()
        return JSONResponse(body(row), headers={"ETag": _etag(row.version)})

    async def _wait(row: StoredContract, known: int, wait_s: float) -> StoredContract:
        """Wait for a version other than `known`, counted as a waiting long poll."""
        feed: ChangeFeed = state["feed"]
        metrics.waiting.inc()
        try:
            return await feed.newer(row, known, wait_s)
        finally:
            metrics.waiting.dec()

    # 400: a body that is not text at all (bytes that are not UTF-8), which FastAPI
    # refuses before validation; found by bench/fuzz.py (schemathesis) undocumented.
    unreadable = {"description": "The body cannot be read: not UTF-8 JSON."}
    acks: dict[int | str, dict[str, Any]] = {400: unreadable, 401: {}, 409: {}, 429: {}}

    @app.post("/v1/contract/ack", response_model=AckOut, responses=acks)
    async def ack(
        request: Request,
        answer: Ack,
        authorization: Annotated[str | None, Header()] = None,
    ) -> AckOut:
        row = await authenticate(request, "ack", authorization)
        status = AckStatus(answer.status)
        feed: ChangeFeed = state["feed"]
        ok = await feed.ack(row.instance_id, answer.version, status, answer.detail, clock())
        if not ok:
            refuse("ack", 409, f"version {answer.version} is not the current one; read it again")
        metrics.acks.labels(str(status)).inc()
        metrics.requests.labels("ack", "200").inc()
        log.info(
            "distributor: %s acknowledged version %d: %s", row.instance_id, answer.version, status
        )
        return AckOut(accepted=True, version=answer.version)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, e: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input back, and fails (500) on bytes that
        # are not UTF-8: say where and what, never the input.
        errors = [
            {"loc": [str(x) for x in err.get("loc", ())], "msg": str(err.get("msg", "")),
             "type": str(err.get("type", ""))}
            for err in e.errors()
        ]  # fmt: skip
        metrics.requests.labels("any", "422").inc()
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(ContractsUnavailable)
    async def unavailable(_request: Request, e: ContractsUnavailable) -> Response:
        log.warning("distributor: %s", e)  # its message never holds a token or digest
        metrics.requests.labels("any", "503").inc()
        return PlainTextResponse(
            "fleet state unreachable; keep the last contract and try again",
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> PlainTextResponse:
        feed: ChangeFeed | None = state.get("feed")
        if feed is None or (not feed.mirror.rows and not feed.loaded):
            return PlainTextResponse("contracts not loaded yet", status_code=503)
        if not feed.healthy:
            # Still ready: nodes keep reading what is known (static stability); only
            # acknowledgements wait for fleet state.
            return PlainTextResponse("serving the last known contracts; fleet state unreachable")
        return PlainTextResponse("ok")

    @app.get("/metrics", include_in_schema=False)
    async def metrics_text() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
