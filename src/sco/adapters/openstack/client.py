"""The HTTP calls sco makes to Nova and Placement, with errors typed by what to do next.

openstacksdk gives the session: clouds.yaml and environment, authentication,
endpoint discovery and timeouts. sco sends the requests itself through the
SDK's service proxies, because it needs what the SDK's resource layer does not
offer (multi-create with `return_reservation_id`, tag filters, Placement's
provider summaries) and one place to map every failure to a provider error.

Idempotent calls (GET, DELETE) are retried with jittered exponential backoff;
a create is never retried blindly: the caller finds out by listing its tag.
"""

from __future__ import annotations

import functools
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sco.adapters.openstack.resilience import BreakerState, Guard, GuardConfig
from sco.ports import (
    Clock,
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    RetryableProviderError,
)

log = logging.getLogger(__name__)

COMPUTE_MICROVERSION = "2.90"  # tags at create (2.52), networks "none" (2.37)
PLACEMENT_MICROVERSION = "1.39"  # provider summaries with capacity and used (1.27)
MICROVERSIONS = {"compute": COMPUTE_MICROVERSION, "placement": PLACEMENT_MICROVERSION}
SERVICES = ("compute", "placement", "image")


class Response(Protocol):
    status_code: int
    text: str
    headers: Mapping[str, str]

    def json(self) -> Any: ...


class Session(Protocol):
    """What sco needs of an SDK service proxy (a keystoneauth Adapter)."""

    def request(self, url: str, method: str, **kwargs: Any) -> Response: ...


@dataclass(frozen=True, slots=True)
class RetryConfig:
    attempts: int = 3  # tries of an idempotent call, the first included
    base_s: float = 0.5  # first backoff; doubles each time, with full jitter
    max_s: float = 8.0


def _message(resp: Response) -> str:
    """The server's own error message, never request headers (the token lives there)."""
    try:
        body = resp.json()
    except ValueError:
        return _plain(resp.text)
    if isinstance(body, Mapping):
        for value in body.values():
            if isinstance(value, Mapping) and "message" in value:
                return str(value["message"])[:300]
            if isinstance(value, list) and value and isinstance(value[0], Mapping):
                return str(value[0].get("detail") or value[0].get("title") or "")[:300]
    return _plain(resp.text)


def _plain(text: str) -> str:
    """An HTML or text error body as one short line."""
    return " ".join(re.sub(r"<[^>]+>", " ", text).split())[:300]


def typed_error(service: str, method: str, path: str, resp: Response) -> ProviderError:
    """Map an HTTP failure to what the caller should do next."""
    status = resp.status_code
    what = f"{service} {method} {path}: HTTP {status}: {_message(resp)}"
    if status == 403 and "quota" in what.lower():
        return QuotaExceeded(what)
    if status == 413 or (status == 403 and "limit" in what.lower()):
        return QuotaExceeded(what)
    if status in (408, 409, 429) or status >= 500:
        return RetryableProviderError(what)
    if status == 401:
        return PermanentProviderError(f"{service}: the credential was refused (HTTP 401)")
    return PermanentProviderError(what)


class CloudClient:
    """Guarded, typed requests to one cloud's compute and placement endpoints."""

    def __init__(
        self,
        sessions: Callable[[str], Session],
        clock: Clock,
        guard: GuardConfig | None = None,
        retry: RetryConfig | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """`sessions(service)` gives the current proxy of a service in SERVICES;
        it is asked on every call so a refreshed credential takes effect at once."""
        self._sessions = sessions
        config = guard or GuardConfig()
        self.guards = {s: Guard(s, clock, config, sleep) for s in SERVICES}
        self._retry = retry or RetryConfig()
        self._sleep = sleep
        self._rng = rng or random.Random()

    # ------------------------------------------------------------ verbs

    def get(
        self,
        service: str,
        path: str,
        params: Mapping[str, str] | None = None,
        ok_missing: bool = False,
    ) -> Any:
        """The answer's JSON; with `ok_missing`, None for a 404."""
        return self._idempotent(
            service, "GET", path, ok_missing=ok_missing, params=dict(params or {})
        )

    def delete(self, service: str, path: str) -> None:
        """Delete; a 404 means already gone, which is what was wanted."""
        self._idempotent(service, "DELETE", path, ok_missing=True)

    def put(self, service: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if body is None:
            return self._idempotent(service, "PUT", path)
        return self._idempotent(service, "PUT", path, json=dict(body))

    def post(self, service: str, path: str, body: Mapping[str, Any]) -> Any:
        """Not retried: a POST that timed out may have taken effect."""
        session = self._session(service, "POST", path)
        return self.guards[service].call(
            lambda: self._once(session, service, "POST", path, json=body)
        )

    # ------------------------------------------------------------ plumbing

    def _idempotent(
        self, service: str, method: str, path: str, ok_missing: bool = False, **kwargs: Any
    ) -> Any:
        guard = self.guards[service]
        attempt = 0
        while True:
            attempt += 1
            session = self._session(service, method, path)
            try:
                return guard.call(
                    functools.partial(
                        self._once, session, service, method, path, ok_missing, **kwargs
                    )
                )
            except RetryableProviderError as e:
                if (
                    attempt >= self._retry.attempts
                    or guard.breaker.state is not BreakerState.CLOSED
                ):
                    raise
                cap = min(self._retry.max_s, self._retry.base_s * 2 ** (attempt - 1))
                delay = self._rng.uniform(0, cap)
                log.info("%s; retry %d in %.2f s", e, attempt, delay)
                self._sleep(delay)

    def _session(self, service: str, method: str, path: str) -> Session:
        """The service's proxy with a current credential. Asked outside the endpoint's
        guard and retries: a credential that cannot be had now (its secret store away)
        is not the endpoint failing, so it neither opens the endpoint's breaker (which
        would keep sco off the endpoint for its cool-down once the credential is back)
        nor is retried here (the secret source backs off itself)."""
        try:
            return self._sessions(service)
        except ProviderError:
            raise
        except Exception as e:  # building a connection: openstacksdk raises many kinds
            raise _transport_error(service, method, path, e) from None

    def _once(
        self,
        session: Session,
        service: str,
        method: str,
        path: str,
        ok_missing: bool = False,
        **kwargs: Any,
    ) -> Any:
        version = MICROVERSIONS.get(service)
        if version:
            kwargs["microversion"] = version
        try:
            resp = session.request(path, method, raise_exc=False, **kwargs)
        except ProviderError:
            raise
        except Exception as e:  # keystoneauth and requests raise many kinds
            raise _transport_error(service, method, path, e) from None
        if ok_missing and resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise typed_error(service, method, path, resp)
        if resp.status_code == 204 or not resp.text:
            return None
        try:
            return resp.json()
        except ValueError:
            raise RetryableProviderError(f"{service} {method} {path}: answer is not JSON") from None


def _transport_error(service: str, method: str, path: str, e: Exception) -> ProviderError:
    """Connection failures and timeouts may pass; auth and discovery failures will not.
    Only the exception's class name is kept: keystoneauth messages can quote
    request details."""
    name = type(e).__name__
    what = f"{service} {method} {path}: {_TRANSPORT.get(name, 'failed')} ({name})"
    if name in _PERMANENT:
        return PermanentProviderError(what)
    return RetryableProviderError(what)


_TRANSPORT = {
    "ConnectFailure": "endpoint unreachable",
    "ConnectionError": "endpoint unreachable",
    "ConnectionRefusedError": "endpoint unreachable",
    "SSLError": "endpoint unreachable",
    "DiscoveryFailure": "endpoint unreachable or not an OpenStack API",
    "ConnectTimeout": "no answer in time",
    "RequestTimeout": "no answer in time",
    "ReadTimeout": "no answer in time",
    "Unauthorized": "the credential was refused",
    "MissingRequiredOptions": "the cloud's auth settings are incomplete",
    "EndpointNotFound": "no such endpoint in the catalog",
    "EmptyCatalog": "no such endpoint in the catalog",
}
_PERMANENT = frozenset(
    {
        "Unauthorized",
        "MissingRequiredOptions",
        "EndpointNotFound",
        "EmptyCatalog",
        "AuthorizationFailure",
        "ConfigException",
        "NoMatchingPlugin",
    }
)
