"""What the swarm's wrappers tell it of each action sco takes (`sco.lab.swarm.faults.Stage`),
and the promises it checks there and then: who acted, on whose servers, and whether
the action still stood when it went out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sco.engine.clock import ManualClock
from sco.lab.region import SimRegion
from sco.lab.swarm.checks import Ledger
from sco.lab.swarm.faults import Schedule
from sco.lab.swarm.promises import Breaches
from sco.lab.swarm.spec import BLUE, Kind
from sco.lab.swarm.world import Installation

if TYPE_CHECKING:
    from sco.lab.swarm.adversary import Adversary

# Faults that stall or stop a replica: a refused write may follow them in any rollout.
STALLS = (Kind.LEASE_LOSS, Kind.TAKEOVER_MID_CYCLE, Kind.KILL, Kind.CLOCK_SKEW,
          Kind.DATABASE_DOWN, Kind.SLOW_CLOUD)  # fmt: skip


class Hooks:
    """The `Stage` half of the running swarm (`sco.lab.swarm.run.Swarm`)."""

    clock: ManualClock
    region: SimRegion
    schedule: Schedule
    ledger: Ledger
    breaches: Breaches
    adversary: Adversary
    blue: Installation
    _leaving: set[str]
    _in_takeover: bool

    def now(self) -> float:
        return self.clock.now()

    def slow(self, seconds: float) -> None:
        """The world moves on while a call waits: the region and the clock, not the
        other replicas (their turn comes when this one's cycle returns)."""
        t = self.clock.now() + seconds
        self.region.advance_to(t)
        self.clock.set(t)

    def acted(self, replica: str, partition: str, what: str, detail: str) -> None:
        key = (replica, partition)
        if key in self.adversary.fenced and what != "tend":
            self.ledger.violate(
                "fenced_stops_and_says_so",
                self.now(),
                f"{replica} refused a write to {partition}, then {what} {detail}",
            )

    def asked_to_delete(self, installation: str, server_ids: Sequence[str]) -> None:
        if installation == BLUE:
            self._leaving.update(server_ids)

    def touched(self, installation: str, server_ids: Sequence[str], what: str) -> None:
        self.ledger.checked["own_servers_only"] += len(server_ids)
        for sid in server_ids:
            owner = self.region.installation_of(sid)
            if owner is not None and owner != installation:
                self.ledger.violate(
                    "own_servers_only", self.now(), f"{installation} {what} {owner}'s {sid}"
                )

    def created(self, request_id: str, partition: str, installation: str) -> None:
        self.ledger.checked["one_create_per_reservation"] += 1
        self.ledger.creates[request_id] += 1
        if self.ledger.creates[request_id] > 1:
            self.ledger.violate(
                "one_create_per_reservation", self.now(), f"request {request_id} sent again"
            )
        if installation == BLUE:
            handed = partition in self.adversary.handed
            self.breaches.look("handback_creates_nothing", handed,
                               f"{partition} handed back, {request_id} sent")  # fmt: skip

    def refused_write(self, replica: str, partition: str) -> None:
        self.ledger.checked["fenced_stops_and_says_so"] += 1
        self.adversary.fenced[(replica, partition)] = self.now()
        if self.now() <= self.adversary.mixed_until:
            stalled = any(self.schedule.active(k) for k in STALLS)
            self.breaches.look("rollout_hands_over_once", not stalled,
                               f"{replica}'s write to {partition} refused mid-rollout")  # fmt: skip

    def takeover(self, victim: str, partition: str) -> None:
        """The victim stalls mid-cycle past its lease; the other replica takes the
        partition and cycles it; then the victim's call returns."""
        if self._in_takeover:
            return
        self._in_takeover = True
        try:
            self.adversary.takeover(victim, partition)
        finally:
            self._in_takeover = False

    def sending(self, replica: str, installation: str, partition: str, request_id: str) -> None:
        """A create goes out only while its sender leads the partition (as it knows) and
        its records stand: not after the replica let the partition go, nor once its
        records were closed (the listing grace) while it waited for a worker."""
        if installation != BLUE:
            return
        r = self.blue.replicas.get(replica)
        leads = r is not None and partition in r.runner.held
        standing = any(i.request_id == request_id for i in self.blue.store.instances(partition))
        why = "" if standing else "its records were closed"
        why = why or ("" if leads else f"{replica} no longer led {partition}")
        self.breaches.look("create_only_while_standing", bool(why),
                           f"{request_id} sent for {partition}: {why}")  # fmt: skip
