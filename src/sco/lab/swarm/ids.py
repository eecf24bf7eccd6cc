"""A replica's id source under the swarm: while `ids_repeat` lasts it hands out, for
each kind of id, the one it handed out last (as a source seeded alike on two
machines, or a counter that restarted, would). Every id sco writes is a key: a
record, a reservation and a create's request must stay one's own."""

from __future__ import annotations

from sco.engine.clock import IdSource
from sco.lab.swarm.faults import Schedule
from sco.lab.swarm.spec import Kind


class RepeatingIds:
    def __init__(self, inner: IdSource, schedule: Schedule, replica: str) -> None:
        self.inner = inner
        self.schedule = schedule
        self.replica = replica
        self._last: dict[str, str] = {}

    def new(self, kind: str) -> str:
        last = self._last.get(kind)
        if last is not None and self.schedule.hit(Kind.IDS_REPEAT, self.replica):
            return last
        self._last[kind] = fresh = self.inner.new(kind)
        return fresh
