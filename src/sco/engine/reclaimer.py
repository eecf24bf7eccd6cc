"""The reference reclaimer: the cloud operator's side of the reclaim-notice contract.

It asks for a hall and flavor's spot servers back: chooses them by least harm
under a disruption budget (`sco.decide.reclaim`), sets each one's notice
(`sco:reclaim-at`), and deletes what is still there at the deadline. The notices
live on the servers, so a restarted reclaimer (or `sweep`) finds and deletes the
ones whose deadline has passed. It also remembers the notices it set: Nova writes
a server's metadata whole, so two writes at once can lose one (seen when sco
handed a node its token as the notice was set), and a notice lost so is set again
and its server still goes at the deadline.

`sco.lab.reclaim_replay` drives it from a capacity trace.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sco.decide.reclaim import Budget, Candidate, Choice, Standing, choose
from sco.domain.lifecycle import State
from sco.domain.pools import Pool
from sco.domain.times import utc
from sco.ports import Clock, InstanceStore, PlanStore, ProviderError, ServerView

log = logging.getLogger(__name__)


class ReclaimFleet(InstanceStore, PlanStore, Protocol):
    """What the reclaimer reads of fleet state to choose by least harm."""


class ReclaimCloud(Protocol):
    def pools(self) -> Sequence[Pool]: ...

    def all_servers(self) -> Sequence[ServerView]: ...

    def give_notice(self, server_id: str, deadline: float) -> float:
        """Set the notice unless one is set; returns the deadline in force. A notice
        set but unreadable is no deadline: a ProviderError, never a guess."""
        ...

    def delete(self, server_ids: Sequence[str]) -> None: ...


@dataclass(frozen=True, slots=True)
class Noticed:
    choice: Choice
    deadline: float
    failed: tuple[str, ...]  # servers whose notice could not be set (or already was)


class Reclaimer:
    def __init__(
        self, cloud: ReclaimCloud, clock: Clock, fleet: ReclaimFleet | None = None
    ) -> None:
        self.cloud = cloud
        self.clock = clock
        self.fleet = fleet
        self._given: dict[str, float] = {}  # server -> deadline, of notices set here

    def candidates(self, hall: str, flavor: str) -> list[Candidate]:
        """The spot servers of `hall` and `flavor`, with what sco's fleet state says
        of them (serving or not) when it can be read."""
        return self.survey(hall, flavor)[0]

    def survey(
        self, hall: str | None, flavor: str | None, partition: str | None = None
    ) -> tuple[list[Candidate], dict[str, Standing]]:
        """The candidates of `hall` and `flavor` (None: any), of `partition` only when
        given (a drill), and the standing of their partitions over every server they
        hold (what the disruption budget counts), from one listing so that both agree."""
        spot = {
            p.id
            for p in self.cloud.pools()
            if p.is_spot and hall in (None, p.hall) and flavor in (None, p.flavor)
        }
        if not spot:
            raise ValueError(
                f"no spot pool of flavor {flavor or 'any'!r} in hall {hall or 'any'!r}"
            )
        every = self.cloud.all_servers()
        servers = [v for v in every if v.pool in spot and partition in (None, v.partition)]
        serving = self._serving({v.partition for v in servers})
        found = [
            Candidate(
                server_id=v.server_id,
                partition=v.partition,
                created_at=v.created_at,
                serving=v.server_id in serving if serving is not None else True,
                noticed=self._noticed(v),
            )
            for v in servers
        ]
        held = Counter(v.partition for v in every)
        noticed = Counter(v.partition for v in every if self._noticed(v))
        return found, {p: Standing(n, noticed[p]) for p, n in held.items()}

    def _serving(self, partitions: set[str]) -> set[str] | None:
        if self.fleet is None:
            return None
        return {
            i.server_id
            for p in partitions
            for i in self.fleet.instances(p)
            if i.state is State.READY and i.server_id
        }

    def over_target(self, candidates: Sequence[Candidate]) -> Mapping[str, int]:
        """Servers each partition holds above its latest plan (fleet state)."""
        if self.fleet is None:
            return {}
        out: dict[str, int] = {}
        for partition in {c.partition for c in candidates}:
            plan = self.fleet.latest_plan(partition)
            if plan is None:
                continue
            live = sum(1 for i in self.fleet.instances(partition) if i.is_live)
            out[partition] = max(0, live - sum(plan.targets().values()))
        return out

    def request(
        self,
        hall: str | None,
        flavor: str | None,
        count: int,
        notice_s: float,
        budget: Budget,
        partition: str | None = None,
    ) -> Noticed:
        """Give notice to up to `count` spot servers of `hall`/`flavor` (None: any), of
        `partition` only when given."""
        found, standing = self.survey(hall, flavor, partition)
        choice = choose(found, count, self.over_target(found), budget, standing)
        deadline = self.clock.now() + notice_s
        failed: list[str] = []
        for v in choice.victims:
            try:
                in_force = self.cloud.give_notice(v.server_id, deadline)
                self._given[v.server_id] = in_force
                if in_force != deadline:
                    failed.append(v.server_id)  # noticed meanwhile: its deadline stands
                    continue
                log.info(
                    "reclaim: %s (%s) goes at %s: %s",
                    v.server_id,
                    v.partition,
                    utc(deadline),
                    v.why,
                )
            except ProviderError as e:
                failed.append(v.server_id)
                log.warning("reclaim: notice to %s not set: %s", v.server_id, e)
        return Noticed(choice, deadline, tuple(failed))

    def sweep(self) -> list[str]:
        """Delete the spot servers whose notice's deadline has passed, and set again a
        notice of this reclaimer's that its server lost. Only servers of the cloud's
        spot pools are deleted, and only on a notice that reads as a deadline: a notice
        that does not is reported and the server left alone, since a wrong guess here
        deletes capacity someone may be paying to keep."""
        now = self.clock.now()
        spot = {p.id for p in self.cloud.pools() if p.is_spot}
        listed = self.cloud.all_servers()
        due: list[str] = []
        lost: list[tuple[str, float]] = []
        for v in listed:
            deadline = self._deadline(v)
            if v.notice_unreadable:
                log.warning(
                    "reclaim: %s (%s) left alone: its notice %r is not a deadline",
                    v.server_id, v.partition, v.notice_unreadable,
                )  # fmt: skip
            elif deadline is None:
                continue
            elif v.pool not in spot:
                log.warning(
                    "reclaim: %s (%s) left alone: noticed, but of pool %s, not a spot pool",
                    v.server_id, v.partition, v.pool,
                )  # fmt: skip
            elif deadline <= now:
                due.append(v.server_id)
            elif v.notice_deadline is None:
                lost.append((v.server_id, deadline))
        if due:
            self.cloud.delete(due)
            log.info("reclaim: deleted %d servers at their deadline", len(due))
        self._set_again(lost)
        still = {v.server_id for v in listed}.difference(due)
        self._given = {sid: d for sid, d in self._given.items() if sid in still}
        return due

    def _set_again(self, lost: Sequence[tuple[str, float]]) -> None:
        """Notices set here that their servers no longer show: another write to the
        server's metadata took them. The node must still be told."""
        for server_id, deadline in lost:
            log.warning(
                "reclaim: %s lost its notice (another write to its metadata); set again "
                "for %s", server_id, utc(deadline),
            )  # fmt: skip
            try:
                self.cloud.give_notice(server_id, deadline)
            except ProviderError as e:
                log.warning("reclaim: notice to %s not set again: %s", server_id, e)

    def pending(self) -> Counter[str]:
        """Servers under notice by partition, deadline not yet passed."""
        now = self.clock.now()
        return Counter(
            v.partition
            for v in self.cloud.all_servers()
            if (deadline := self._deadline(v)) is not None and deadline > now
        )

    def _deadline(self, v: ServerView) -> float | None:
        """The server's notice: what it shows, else what this reclaimer set."""
        if v.notice_deadline is not None:
            return v.notice_deadline
        return self._given.get(v.server_id)

    def _noticed(self, v: ServerView) -> bool:
        """A notice was set, read or not (an unreadable one is left for a person, not
        noticed again), or this reclaimer set one that the server lost."""
        return self._deadline(v) is not None or bool(v.notice_unreadable)
