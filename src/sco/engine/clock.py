"""Clocks and id sources: the only places time and randomness enter."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Protocol


class SystemClock:
    """Wall-clock time, for real runs."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told: simulations and tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"time runs forward: {t} < {self._now}")
        self._now = t

    def advance(self, dt_s: float) -> None:
        self.set(self._now + dt_s)


class IdSource(Protocol):
    def new(self, kind: str) -> str: ...


class UuidIds:
    def new(self, kind: str) -> str:
        return f"{kind}-{uuid.uuid4().hex}"


class CountingIds:
    """Deterministic ids, so a seeded simulation repeats exactly."""

    def __init__(self, prefix: str = "") -> None:
        self._n = itertools.count(1)
        self._prefix = prefix

    def new(self, kind: str) -> str:
        return f"{kind}-{self._prefix}{next(self._n):08d}"
