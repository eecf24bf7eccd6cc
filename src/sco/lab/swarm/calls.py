"""A replica's call workers as the swarm runs them: `sco run` hands each create and
delete to a pool of workers (`provider.calls_in_flight`) and the cycle goes on; the
answer is recorded by a later cycle. Here the calls wait in a queue and the seed says
when each goes: in a step, the workers get through as many calls as the cloud's
latency lets them, each queued call taken with odds (a worker held up by a slow
answer leaves it for the next step), none while a `calls_stalled` fault lasts (the
workers busy with calls that hang). So a create may go out a cycle later, after its
lease was let go, or after its records were closed, as it may in production; and a
run can still be repeated exactly.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

# Odds that a free worker takes the next queued call in a step (otherwise it waits
# for the next): answers come a cycle later now and then, as a busy pool gives them.
TAKES = 0.8


@dataclass
class _Queued:
    future: Future[Any]
    call: Callable[[], Any]


class SeededCalls(Executor):
    """One process's worker pool, stepped by the swarm."""

    def __init__(self, rng: random.Random, per_step: int) -> None:
        """`per_step`: the calls the workers get through in a step (workers times the
        step over the cloud's latency)."""
        self.rng = rng
        self.per_step = per_step
        self.queue: deque[_Queued] = deque()
        self.held = 0  # calls a stall kept waiting (a fault's effect)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.queue.append(_Queued(future, lambda: fn(*args, **kwargs)))
        return future

    def step(self, stalled: bool) -> int:
        """The calls the workers take this step, run in the order they were queued;
        returns how many ran."""
        if stalled:
            self.held += len(self.queue)
            return 0
        taken: list[_Queued] = []
        left: deque[_Queued] = deque()
        for queued in self.queue:
            fits = len(taken) < self.per_step and self.rng.random() < TAKES
            (taken if fits else left).append(queued)
        self.queue = left
        for queued in taken:
            try:
                queued.future.set_result(queued.call())
            except Exception as e:  # the worker hands it to the cycle, as a thread would
                queued.future.set_exception(e)
        return len(taken)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # noqa: ARG002 (nothing runs on its own)
        """The process stops: calls not yet taken are never sent."""
        if cancel_futures:
            for queued in self.queue:
                queued.future.cancel()
            self.queue.clear()
