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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NoReturn

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from sco.adapters.sqlstate import DatabaseError
from sco.adapters.sqlstate.contracts import ContractStore
from sco.apps.listen import name_process
from sco.domain.contracts import AckStatus, Contract, NodeState, StoredContract, token_digest
from sco.engine.admission import Admission
from sco.ports.contracts import Listener

log = logging.getLogger(__name__)

Clock = Callable[[], float]


# ---------------------------------------------------------------- change feed


class Mirror:
    """This replica's copy of the contracts a node may ask for, by instance and by
    token digest: requests are answered from it, without a database read."""

    def __init__(self, gone_keep_s: float) -> None:
        self.gone_keep_s = gone_keep_s
        self.rows: dict[str, StoredContract] = {}
        self._by_digest: dict[str, str] = {}

    def load(self, rows: Iterable[StoredContract]) -> None:
        self.rows.clear()
        self._by_digest.clear()
        self.apply(rows, now=time.time())

    def apply(self, rows: Iterable[StoredContract], now: float) -> None:
        for row in rows:
            old = self.rows.get(row.instance_id)
            if old is not None and old.version > row.version:
                # A read that began before a newer version this copy already holds
                # (from a request's own read): a node never sees its contract go back.
                continue
            if old is not None and old.token_hash and old.token_hash != row.token_hash:
                self._by_digest.pop(old.token_hash, None)
            if row.terms.state is NodeState.GONE and row.changed_at < now - self.gone_keep_s:
                self.rows.pop(row.instance_id, None)
                continue
            self.rows[row.instance_id] = row
            if row.token_hash:
                self._by_digest[row.token_hash] = row.instance_id

    def by_digest(self, digest: str, now: float) -> StoredContract | None:
        instance_id = self._by_digest.get(digest)
        row = self.rows.get(instance_id) if instance_id else None
        if row is None or row.token_hash != digest:
            return None
        if row.token_expires_at is None or row.token_expires_at <= now:
            return None
        return row


class ChangeFeed:
    """Keeps the mirror current from `contract_changes` and wakes the requests
    waiting on contracts that changed."""

    def __init__(
        self, contracts: ContractStore, poll_s: float, gone_keep_s: float = 86400.0
    ) -> None:
        self.contracts = contracts
        self.poll_s = poll_s
        self.mirror = Mirror(gone_keep_s)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._poke = asyncio.Event()
        self.last = 0
        self.loaded = False
        self.healthy = False
        # Whether the copy was ever filled: before, a token missing from it says
        # nothing about the token.
        self.copied = False
        self._pruned_at = 0.0

    def register(self, instance_id: str) -> asyncio.Event:
        ev = asyncio.Event()
        self._waiters.setdefault(instance_id, set()).add(ev)
        return ev

    def unregister(self, instance_id: str, ev: asyncio.Event) -> None:
        waiting = self._waiters.get(instance_id)
        if waiting is not None:
            waiting.discard(ev)
            if not waiting:
                del self._waiters[instance_id]

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def poke(self) -> None:
        self._poke.set()

    async def _load(self) -> None:
        """Everything, from where the change log stands (read first: a change after
        it is read again, which is harmless)."""
        last = await asyncio.to_thread(self.contracts.last_change)
        gone_since = time.time() - self.mirror.gone_keep_s
        rows = await asyncio.to_thread(self.contracts.current, gone_since)
        self.mirror.load(rows)
        self.last = last
        self.copied = True
        # Fleet state answered: ready, not "unreachable" while the first follow of
        # the change log is still to come (found by a loaded CI run).
        self.loaded = self.healthy = True
        log.info("distributor: %d contracts loaded (changes up to %d)", len(rows), last)

    async def run(self) -> None:
        while True:
            try:
                if not self.loaded:
                    await self._load()
                    self._wake(self.mirror.rows)  # anything waited on may have moved
                await self._follow()
                self.healthy = True
            except Exception as e:  # the database is away: serve what is known
                if self.healthy or not self.loaded:
                    log.warning("distributor: cannot read contract changes: %s", e)
                self.healthy = False
                # Back, read everything again: meanwhile the log may have been pruned
                # past where this copy stands.
                self.loaded = False
                await asyncio.sleep(min(5.0, self.poll_s * 4))
                continue
            # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that
            # arrives as the poke does, and the app's shutdown then waited forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._poke.wait()
            self._poke.clear()

    async def _follow(self) -> None:
        last, changed = await asyncio.to_thread(self.contracts.changed_since, self.last)
        if changed:
            rows = await asyncio.to_thread(self.contracts.get_many, sorted(changed))
            self.mirror.apply(rows.values(), now=time.time())
            self.last = last
            self._wake(changed)
        if time.time() - self._pruned_at > 600:
            self._pruned_at = time.time()
            await asyncio.to_thread(self.contracts.prune_changes, time.time() - 3600)

    def learn(self, row: StoredContract) -> None:
        """A row a request read from fleet state itself: newer than this copy, so
        the copy takes it (else the next request, served from the copy, would see
        an older version than this one did)."""
        self.mirror.apply([row], now=time.time())
        self._wake([row.instance_id])

    def _wake(self, instance_ids: Iterable[str]) -> None:
        for instance_id in instance_ids:
            for ev in self._waiters.get(instance_id, ()):
                ev.set()


# ---------------------------------------------------------------- API


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
    contracts: ContractStore,
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
        task = asyncio.create_task(feed.run())
        stop = threading.Event()
        listener = None
        if listen is not None:
            loop = asyncio.get_running_loop()
            listener = threading.Thread(
                target=listen,
                args=(lambda: loop.call_soon_threadsafe(feed.poke), stop),
                name="contracts-listen",
                daemon=True,
            )
            listener.start()
        try:
            yield
        finally:
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
            digest = token_digest(token.strip())
            feed: ChangeFeed = state["feed"]
            row = feed.mirror.by_digest(digest, clock())
            if row is None and (not feed.copied or admission.may_look_further(client)):
                # Not in this replica's copy, which may be a moment behind (a token
                # just issued) or not filled yet (a replica starting, whatever the
                # address's failures): ask fleet state.
                row = await asyncio.to_thread(contracts.by_token, digest, clock())
                if row is not None:
                    feed.learn(row)
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
        contract = Contract(
            instance_id=row.instance_id,
            version=row.version,
            terms=row.terms,
            join=config.join(row.terms.partition),
            lease_expires_at=clock() + config.lease_s,
        )
        return contract.as_json()

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
        """Wait for a version other than `known`. The mirror changes only in this
        event loop, and wakes whoever is registered when it does: nothing slips
        between reading it and registering."""
        feed: ChangeFeed = state["feed"]
        ev = feed.register(row.instance_id)
        metrics.waiting.inc()
        try:
            deadline = time.monotonic() + wait_s
            while True:
                fresh = feed.mirror.rows.get(row.instance_id, row)
                if fresh.version != known:
                    return fresh
                left = deadline - time.monotonic()
                if left <= 0:
                    return fresh
                ev.clear()
                with contextlib.suppress(TimeoutError):  # not wait_for: see ChangeFeed.run
                    async with asyncio.timeout(left):
                        await ev.wait()
        finally:
            metrics.waiting.dec()
            feed.unregister(row.instance_id, ev)

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
        ok = await asyncio.to_thread(
            contracts.ack, row.instance_id, answer.version, status, answer.detail, clock()
        )
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

    @app.exception_handler(DatabaseError)
    async def unavailable(_request: Request, e: DatabaseError) -> Response:
        log.warning("distributor: fleet state: %s", type(e).__name__)
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
