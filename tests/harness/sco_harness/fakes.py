"""A provider that records what it is asked and misbehaves on purpose, around a real one.

As Karpenter's fake cloud provider keeps its create calls and takes the next
error to raise: every call is logged, `fail_next` makes the next call of a kind
raise, and `block_creates(partition)` holds a partition's creates until
`release` (Nova's scheduler can take a minute), so error and timing branches
of the controllers are tested on purpose rather than by a random fault rate.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from sco.domain.pools import Pool, PoolId
from sco.ports import CreateResult, Provider, ProviderError, ServerView


class RecordingProvider:
    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []  # (method, partition or "")
        self._errors: dict[str, list[ProviderError]] = {}
        self._blocked: dict[str, threading.Event] = {}  # partition -> released
        self._waiting: dict[str, threading.Event] = {}  # partition -> a create is held
        self._lock = threading.Lock()

    # ------------------------------------------------------------ control

    def fail_next(self, method: str, error: ProviderError) -> None:
        with self._lock:
            self._errors.setdefault(method, []).append(error)

    def block_creates(self, partition: str) -> None:
        with self._lock:
            self._blocked[partition] = threading.Event()
            self._waiting[partition] = threading.Event()

    def release(self, partition: str) -> None:
        with self._lock:
            gate = self._blocked.pop(partition, None)
        if gate is not None:
            gate.set()

    def wait_blocked(self, partition: str, timeout_s: float) -> bool:
        """Wait until a create of `partition` is being held."""
        with self._lock:
            waiting = self._waiting.get(partition)
        return waiting is not None and waiting.wait(timeout_s)

    def _call(self, method: str, partition: str = "") -> None:
        with self._lock:
            self.calls.append((method, partition))
            queue = self._errors.get(method)
            error = queue.pop(0) if queue else None
        if error is not None:
            raise error

    # ------------------------------------------------------------ Provider

    def pools(self) -> Sequence[Pool]:
        return self.inner.pools()

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        self._call("headroom")
        return self.inner.headroom(pools)

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        return self.inner.prices(pools)

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        with self._lock:
            gate = self._blocked.get(partition)
            waiting = self._waiting.get(partition)
        if gate is not None and waiting is not None:
            waiting.set()
            gate.wait()
        self._call("create", partition)
        return self.inner.create(pool, count, request_id, partition, plan_generation)

    def delete(self, server_ids: Sequence[str]) -> None:
        self._call("delete")
        self.inner.delete(server_ids)

    def list(self, partition: str) -> Sequence[ServerView]:
        self._call("list", partition)
        return self.inner.list(partition)
