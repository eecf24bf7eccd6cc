"""Guards around each OpenStack endpoint: a circuit breaker and a rate limit.

One `Guard` per endpoint (compute, placement), so a failing Placement never
stops server listing, and a Nova outage is noticed once and then skipped
cheaply until its cool-down ends. Time comes from an injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from sco.ports import Clock, RetryableProviderError

T = TypeVar("T")


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitOpen(RetryableProviderError):
    """The endpoint failed too often lately; calls are refused until its cool-down ends."""


@dataclass(frozen=True, slots=True)
class GuardConfig:
    failures_to_open: int = 5  # consecutive retryable failures that open the breaker
    # Open this long before one probe is let through; each failed probe doubles it, up
    # to open_for_s. A fixed 30 s kept sco off Nova for most of that after a 10 s
    # storm (the fault matrix: 27 s to recover); a long outage is still probed
    # only every open_for_s.
    first_open_s: float = 5.0
    open_for_s: float = 30.0
    rate_per_s: float = 20.0  # client-side request rate per endpoint
    burst: int = 40

    def __post_init__(self) -> None:
        if self.failures_to_open < 1:
            raise ValueError(f"failures_to_open must be >= 1, got {self.failures_to_open}")
        if self.open_for_s <= 0 or self.rate_per_s <= 0 or self.burst < 1:
            raise ValueError("open_for_s and rate_per_s must be > 0 and burst >= 1")
        if not 0 < self.first_open_s <= self.open_for_s:
            raise ValueError(
                f"first_open_s must be > 0 and <= open_for_s ({self.open_for_s}), "
                f"got {self.first_open_s}"
            )


class CircuitBreaker:
    """Closed: calls go through. After `failures_to_open` consecutive failures it
    opens; after `first_open_s` it is half-open and lets one call probe: success
    closes it, failure opens it again for twice as long (at most `open_for_s`)."""

    def __init__(self, name: str, clock: Clock, config: GuardConfig) -> None:
        self.name = name
        self._clock = clock
        self._config = config
        self._failures = 0
        self._opened_at: float | None = None
        self._open_for = config.first_open_s  # this opening's cool-down
        self._probing = False
        self._lock = threading.Lock()

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock.now() - self._opened_at >= self._open_for:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def admit(self) -> None:
        """Raise CircuitOpen unless a call may go out now."""
        with self._lock:
            state = self._state()
            if state is BreakerState.CLOSED:
                return
            if state is BreakerState.HALF_OPEN and not self._probing:
                self._probing = True
                return
            assert self._opened_at is not None
            left = self._open_for - (self._clock.now() - self._opened_at)
            raise CircuitOpen(f"{self.name} endpoint is failing; not calling it for {left:.0f} s")

    def succeeded(self) -> None:
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._open_for = self._config.first_open_s
            self._probing = False

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            if self._probing:
                self._open_for = min(2 * self._open_for, self._config.open_for_s)
                self._opened_at = self._clock.now()
            elif self._failures >= self._config.failures_to_open:
                self._opened_at = self._clock.now()
            self._probing = False


class TokenBucket:
    """At most `rate_per_s` calls a second on average, `burst` at once; `take`
    sleeps (through `sleep`) until a token is free."""

    def __init__(
        self, clock: Clock, rate_per_s: float, burst: int, sleep: Callable[[float], None]
    ) -> None:
        self._clock = clock
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at = clock.now()
        self._sleep = sleep
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            now = self._clock.now()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            self._tokens -= 1.0
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)


class Guard:
    """A breaker and a rate limit for one endpoint."""

    def __init__(
        self, name: str, clock: Clock, config: GuardConfig, sleep: Callable[[float], None]
    ) -> None:
        self.name = name
        self.breaker = CircuitBreaker(name, clock, config)
        self.bucket = TokenBucket(clock, config.rate_per_s, config.burst, sleep)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` if the breaker admits it; a RetryableProviderError from it counts
        as a failure, anything else (including a refusal the server gave on
        purpose) as proof that the endpoint is up."""
        self.breaker.admit()
        self.bucket.take()
        try:
            result = fn()
        except RetryableProviderError:
            self.breaker.failed()
            raise
        except BaseException:
            self.breaker.succeeded()
            raise
        self.breaker.succeeded()
        return result
