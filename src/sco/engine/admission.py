"""Who the contract distributor serves: a valid node token first, limits after.

A node's token is checked before its address's failed-authentication limit, so
that many agents behind one address (a NAT), some still holding a token that was
just rotated, do not lock out the ones holding a valid token: the limit is there
to slow the guessing of tokens, and a valid token is no guess. An invalid token
is refused with 401 while its address is under the limit, and with 429 (and
Retry-After) once it is over; either way it is counted. Requests with a valid
token are limited per token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class Buckets:
    """Token buckets by key: `rate` per second, up to `burst`; idle keys are forgotten."""

    rate: float
    burst: float
    clock: Clock = time.monotonic
    _state: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (level, at)

    def take(self, key: str) -> bool:
        now = self.clock()
        level, at = self._state.get(key, (self.burst, now))
        level = min(self.burst, level + (now - at) * self.rate)
        if level < 1.0:
            self._state[key] = (level, now)
            return False
        self._state[key] = (level - 1.0, now)
        if len(self._state) > 100_000:
            self._forget(now)
        return True

    def allows(self, key: str) -> bool:
        """Whether `take` would succeed, without taking."""
        now = self.clock()
        level, at = self._state.get(key, (self.burst, now))
        return min(self.burst, level + (now - at) * self.rate) >= 1.0

    def _forget(self, now: float) -> None:
        full = self.burst / self.rate
        for key in [k for k, (_, at) in self._state.items() if now - at > full]:
            del self._state[key]


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int
    why: str
    headers: Mapping[str, str]
    limit: str | None  # the rate limit that refused (a metric label), None for a 401
    failed_auth: bool  # the request carried no valid token


# An invalid token is told so on a 429 too (RFC 6750's error code), so that an agent
# holding a rotated token reads it again rather than only waiting.
_INVALID = 'Bearer error="invalid_token"'


@dataclass
class Admission:
    """The distributor's limits, per client address and per token."""

    failures_per_min: float
    requests_per_s: float
    clock: Clock = time.monotonic
    failures: Buckets = field(init=False)
    per_token: Buckets = field(init=False)

    def __post_init__(self) -> None:
        per_s = self.failures_per_min / 60.0
        self.failures = Buckets(per_s, self.failures_per_min, self.clock)
        self.per_token = Buckets(self.requests_per_s, self.requests_per_s * 4, self.clock)

    def may_look_further(self, client: str) -> bool:
        """Whether a token not in the replica's copy is worth a fleet-state read: not
        for an address over its failure limit, whose guesses must not cost a query
        each (a token issued a moment ago is in the copy when it asks again)."""
        return self.failures.allows(client)

    def admit(self, client: str, instance_id: str | None) -> Refusal | None:
        """None to serve the node `instance_id` (None: no valid token) asking from
        `client`; otherwise how to refuse it."""
        if instance_id is None:
            if not self.failures.take(client):
                headers = {"Retry-After": "60", "WWW-Authenticate": _INVALID}
                why = "too many failed authentications"
                return Refusal(429, why, headers, "auth_failures", failed_auth=True)
            headers = {"WWW-Authenticate": "Bearer"}
            return Refusal(401, "a valid node token is needed", headers, None, failed_auth=True)
        if not self.per_token.take(instance_id):
            headers = {"Retry-After": "1"}
            return Refusal(429, "too many requests for this node", headers, "requests", False)
        return None
