"""Cloud calls a cycle sends without waiting for their answers.

A cycle writes its intent first (the REQUESTED records and their reservation, the
TERMINATING records), then sends the creates and deletes that carry it out. A slow
cloud API then makes a cycle wait for its listing, never for its own creates: the
calls run on a pool of workers (`sco run`), and each answer is applied by the
partition's own cycle, the next one after it came, against the records as they are
then. The records need nothing in between: a request not yet answered is REQUESTED,
which its listing, or the listing grace, settles anyway.

`InlineCalls` runs each call at once, on the cycle's thread, and its answer is
applied before the cycle goes on: the simulator, the swarm and tests stay
deterministic. Which executor a runner gets is `sco.engine.builder`'s to say.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class InlineCalls(Executor):
    """Runs a call when it is sent, on the sender's thread."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future


@dataclass(frozen=True, slots=True)
class Sent(Generic[T]):
    """A call in flight and what applies its answer (on the cycle's thread)."""

    future: Future[T]
    apply: Callable[[Future[T]], int]  # returns the transitions it recorded


class Outbound:
    """One partition's calls in flight."""

    def __init__(self, calls: Executor) -> None:
        self.calls = calls
        self._sent: list[Sent[Any]] = []

    def send(self, call: Callable[[], T], apply: Callable[[Future[T]], int]) -> int:
        """Send `call`; answers that came meanwhile (with INLINE: this one) are applied
        now. Returns the transitions they recorded."""
        self._sent.append(Sent(self.calls.submit(call), apply))
        return self.answers()

    def answers(self) -> int:
        """Apply every answer that has come (in the order their calls were sent). An
        answer the call returned leaves once recorded: one whose recording fails (fleet
        state away) stays, with those behind it, for the next cycle. Dropped, a create's
        answer named its servers nowhere, and one reclaimed before any listing showed
        it had no record. A call that failed is applied once: it fails the same way
        every time."""
        n = 0
        for sent in [s for s in self._sent if s.future.done()]:
            failed = sent.future.cancelled() or sent.future.exception() is not None
            if failed:
                self._sent.remove(sent)
            n += sent.apply(sent.future)
            if not failed:
                self._sent.remove(sent)
        return n

    def take_over(self, before: Outbound) -> None:
        """The calls `before` sent and has not applied the answers of: this one applies
        them (first, as they were sent first). A partition's controller that was
        dropped (its lease lost) and made again in the same process: the answers of
        its creates name servers no listing may ever show (reclaimed at once)."""
        self._sent[:0] = before._sent
        before._sent = []
