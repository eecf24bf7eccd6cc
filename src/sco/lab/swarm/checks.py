"""The swarm's invariants, each with a name, checked as the world runs.

A check never trusts sco's own account where the world can say: work cut short is
read from the schedulers, servers from the region, transitions from fleet state.
Where sco could not have done better (a notice too short, a scheduler or the
cloud away the whole time, no leader), a miss is counted with its cause instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sco.domain.instances import Instance
from sco.domain.lifecycle import EDGES, HAS_SERVER, State, Trigger
from sco.lab.swarm.promises import INVARIANTS
from sco.ports import FleetAudit


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    at_s: float  # from the world's start
    detail: str

    def describe(self) -> str:
        return f"{self.invariant} at {self.at_s:.0f}s: {self.detail}"


@dataclass
class Notice:
    partition: str
    seen_at: float
    deadline: float


@dataclass
class Ledger:
    """What the checks learn as the world runs."""

    start_s: float
    violations: list[Violation] = field(default_factory=list)
    misses: Counter[str] = field(default_factory=Counter)  # notices sco could not honour
    # partition -> (at, could observe and write, scheduler answered) of each cycle a
    # leader ran: what the world allowed, not what sco made of it
    cycles: dict[str, list[tuple[float, bool, bool]]] = field(default_factory=dict)
    noticed: dict[str, Notice] = field(default_factory=dict)  # server -> its first notice
    creates: Counter[str] = field(default_factory=Counter)  # request id -> create calls
    unrecorded: Counter[str] = field(default_factory=Counter)  # server -> looks without record
    short_since: dict[str, float] = field(default_factory=dict)  # partition -> below floor
    checked: Counter[str] = field(default_factory=Counter)

    def violate(self, name: str, now: float, detail: str) -> None:
        assert name in INVARIANTS, name
        if not any(v.invariant == name and v.detail == detail for v in self.violations):
            self.violations.append(Violation(name, now - self.start_s, detail))

    # ------------------------------------------------------------ reclaim notices

    def chances(
        self, partition: str, notice: Notice, window_s: float | None, halfway: bool = False
    ) -> str:
        """Why sco could not have honoured a notice ("" if it could): a cycle must have
        seen it with the scheduler reachable (the drain), and (given `window_s`) a later
        one reached the scheduler within `window_s` of the deadline (the requeue or
        the deletes)."""
        log = [
            c for c in self.cycles.get(partition, []) if notice.seen_at <= c[0] < notice.deadline
        ]
        if notice.deadline - notice.seen_at < 1.0:
            return "notice shorter than a second"
        if not log:
            return "no leader cycled between the notice and its deadline"
        told = [at for at, observed, reached in log if observed and reached]
        if not told:
            if not any(observed for _, observed, _ in log):
                return "the cloud could not be listed between the notice and its deadline"
            return "the scheduler was away between the notice and its deadline"
        if window_s is None:
            return ""
        late = max(notice.deadline - window_s, told[0])
        if halfway:  # Kubernetes: deletes begin no sooner than half way to the deadline
            late = max(late, told[0] + (notice.deadline - told[0]) / 2)
        if not any(reached and at >= late for at, _, reached in log):
            return "no cycle reached the scheduler in the deadline's window"
        return ""

    def _notice(self, server: str, since: float) -> Notice | None:
        """The server's notice, as sco could act on it: from when its node existed."""
        notice = self.noticed.get(server)
        if notice is None:
            return None
        return Notice(notice.partition, max(notice.seen_at, since), notice.deadline)

    def cut(
        self,
        partition: str,
        server: str,
        what: str,
        now: float,
        window_s: float,
        since: float,
        halfway: bool = False,
    ) -> None:
        """Work lost with a noticed server's node (there since `since`): a violation if
        sco had its chances."""
        notice = self._notice(server, since)
        if notice is None:
            return  # not noticed: an unannounced reclaim takes work, nothing to honour
        self.checked["reclaim_reaches_scheduler"] += 1
        why = self.chances(partition, notice, window_s, halfway)
        if why:
            self.misses[why] += 1
            return
        self.violate(
            "reclaim_reaches_scheduler",
            now,
            f"{what} on {server} ({partition}) cut at {now - self.start_s:.0f}s by a reclaim "
            f"noticed at {notice.seen_at - self.start_s:.0f}s for "
            f"{notice.deadline - self.start_s:.0f}s",
        )

    def told(
        self, partition: str, server: str, told_at: float | None, now: float, since: float
    ) -> None:
        """A noticed server's node (there since `since`) is gone: it must have been told
        of the reclaim."""
        notice = self._notice(server, since)
        if notice is None:
            return
        self.checked["reclaim_reaches_scheduler"] += 1
        if told_at is not None and told_at <= notice.deadline:
            return
        why = self.chances(partition, notice, window_s=None)
        if why:
            self.misses[why] += 1
            return
        self.violate(
            "reclaim_reaches_scheduler",
            now,
            f"node of {server} ({partition}) never told of the reclaim noticed at "
            f"{notice.seen_at - self.start_s:.0f}s for {notice.deadline - self.start_s:.0f}s",
        )

    # ------------------------------------------------------------ records

    def records(
        self,
        partition: str,
        records: Sequence[Instance],
        servers: Sequence[str],
        out: set[str],
        now: float,
    ) -> None:
        """After a cycle that observed: every listed server has a record, and no READY
        instance's node is one sco told to leave."""
        self.checked["out_not_counted"] += 1
        self.checked["no_leak"] += 1
        have = {i.server_id for i in records if i.server_id and i.state in HAS_SERVER}
        for i in records:
            if i.state is State.READY and i.server_id in out:
                self.violate(
                    "out_not_counted",
                    now,
                    f"{i.id} ({partition}) READY while sco has its node {i.server_id} out",
                )
        for sid in servers:
            if sid in have:
                self.unrecorded.pop(sid, None)
                continue
            self.unrecorded[sid] += 1
            if self.unrecorded[sid] >= 3:
                self.violate("no_leak", now, f"server {sid} ({partition}) listed, no record")


def check_history(ledger: Ledger, store: FleetAudit, now: float) -> None:
    """Every transition is an edge of the table, and every server has a life."""
    rows = [(h.instance_id, h.from_state, h.to_state, h.trigger) for h in store.history()]
    ledger.checked["transitions_on_table"] += len(rows)
    last: dict[str, str] = {}
    for inst, before, after, trigger in rows:
        if before is None:
            ok = after in ("requested", "creating", "active") and inst not in last
        else:
            edge = EDGES.get((State(before), Trigger(trigger))) if trigger else None
            ok = edge is not None and edge.value == after and last.get(inst) == before
        if not ok:
            ledger.violate(
                "transitions_on_table",
                now,
                f"{inst}: {before} -> {after} on {trigger} (last {last.get(inst)})",
            )
        last[inst] = after


def check_lives(
    ledger: Ledger, store: FleetAudit, created: set[str], alive: set[str], now: float
) -> None:
    """Each server sco created reads back from its record: one record names it, and the
    record is over (gone) once the server is."""
    rows = store.lives()
    by_server: dict[str, list[tuple[str, str]]] = {}
    for inst, sid, state in rows:
        if sid:
            by_server.setdefault(sid, []).append((inst, state))
    ledger.checked["life_in_history"] += len(created)
    for sid in sorted(created):
        lives = by_server.get(sid, [])
        if len(lives) != 1:
            ledger.violate("life_in_history", now, f"server {sid} has {len(lives)} records")
            continue
        inst, state = lives[0]
        if sid in alive and state == "gone":
            ledger.violate("life_in_history", now, f"{inst} gone, its server {sid} is not")
        if sid not in alive and state != "gone":
            ledger.violate("life_in_history", now, f"{inst} {state}, its server {sid} is gone")
