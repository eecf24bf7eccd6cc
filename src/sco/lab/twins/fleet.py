"""Fleet state in memory: the FleetStore port without a database.

What the SQL adapter's rows, constraints and triggers promise, this keeps with
dicts: compare-and-swap on every record's and pool's version (a batch is all or
nothing), a partition's rows refused to a write whose fencing token is below the
partition's (its lease table, `MemoryLeaseTable`), one history row per
transition in the order written, reservations that expire, an outbox read
oldest first and cleared only after its events were handed on, exclusions and
plans that refuse a second writer. Nothing is copied on the way in or out:
records, plans and scores are frozen values.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from sco.domain.events import LifecycleEvent, event_of
from sco.domain.instances import Change, Instance, created
from sco.domain.lifecycle import LIVE, State, Trigger
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, PoolScore
from sco.lab.twins.contracts import MemoryContracts
from sco.lab.twins.leases import MemoryLeaseTable
from sco.ports import (
    FleetCounts,
    HistoryRow,
    NewRequest,
    PoolRecord,
    Reservation,
    StateConflict,
)

_RECLAIMS = frozenset({Trigger.RECLAIM_NOTICE, Trigger.SERVER_VANISHED})


@dataclass
class _PoolRow:
    pool: Pool
    version: int = 0
    up_since: float | None = None


class MemoryFleetStore:
    """Fleet state behind the FleetStore port, in this process only."""

    def __init__(
        self,
        keep_changes: bool = False,
        leases: MemoryLeaseTable | None = None,
        contracts: bool = False,
    ) -> None:
        """`keep_changes`: keep every change recorded, in order, for `changes()` (a copy
        into a database replays them); `leases`: the lease table whose tokens fence its
        writes (default: one of its own, `self.leases`); `contracts`: transitions write
        the nodes' contracts (`self.contracts`), as the database does (a simulation,
        whose nodes read none, leaves them out)."""
        self.leases = leases if leases is not None else MemoryLeaseTable()
        self.contracts = MemoryContracts(self.leases)
        self.write_contracts = contracts
        self._changes: list[Change] | None = [] if keep_changes else None
        self._pools: dict[PoolId, _PoolRow] = {}
        self._instances: dict[str, Instance] = {}
        self._order: dict[str, int] = {}  # an instance's place, as a table's row id
        self._seq = itertools.count()
        self._history: list[HistoryRow] = []
        self._reclaims: list[tuple[float, int, PoolId, str]] = []  # (at, row, pool, instance)
        self._reservations: dict[str, Reservation] = {}
        self._plans: dict[str, dict[int, Plan]] = {}
        self._outbox: dict[str, LifecycleEvent] = {}
        self._exclusions: dict[PoolId, Exclusion] = {}
        self._scores: dict[int, dict[PoolId, PoolScore]] = {}
        self._newest = 0  # the newest generation kept (0: none): asked every cycle
        self._intents: dict[str, tuple[str, float, str]] = {}  # intent, when, by whom

    def close(self) -> None:
        """Nothing to let go; here so that callers treat every store alike."""

    # ------------------------------------------------------------ pools

    def upsert_pools(self, pools: Sequence[Pool]) -> None:
        for p in pools:
            row = self._pools.get(p.id)
            if row is None:
                self._pools[p.id] = _PoolRow(p)
            else:
                row.pool = p

    def pool_records(self) -> Mapping[PoolId, PoolRecord]:
        reserved: Counter[PoolId] = Counter()
        for r in self._reservations.values():
            reserved[r.pool] += r.count
        return {pid: PoolRecord(row.version, reserved[pid]) for pid, row in self._pools.items()}

    def pools(self) -> list[Pool]:
        return [row.pool for row in self._pools.values()]

    # ------------------------------------------------------------ instances

    def instances(self, partition: str) -> list[Instance]:
        live = [
            i
            for i in self._instances.values()
            if i.partition == partition and i.state is not State.GONE
        ]
        # As an index on (partition, state) hands them out.
        live.sort(key=lambda i: (i.state.value, self._order[i.id]))
        return live

    def instance(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id)

    def record(
        self, changes: Sequence[Change], settle: Mapping[str, int] | None = None, fence: int = 0
    ) -> None:
        if not changes and not settle:
            return
        if changes:
            # As the database: records created are fenced as they are inserted, before
            # their keys are checked; an update fires the fence only on the version it
            # matched.
            self.leases.check({ch.after.partition for ch in changes if ch.before is None}, fence)
            self._check(changes)
            self.leases.check({ch.after.partition for ch in changes}, fence)
            self._apply(changes)
        for request_id, count in (settle or {}).items():
            self._settle(request_id, count)

    def _check(self, changes: Sequence[Change]) -> None:
        """Refuse the whole batch if one change of it would not hold: a record created
        twice, or one changed from a version it no longer has."""
        versions: dict[str, int] = {}
        for ch in changes:
            if ch.before is None:
                if ch.after.id in self._instances or ch.after.id in versions:
                    raise StateConflict(f"instance {ch.after.id} exists")
                versions[ch.after.id] = ch.after.version
        for ch in changes:
            if ch.before is None:
                continue
            now = versions.get(ch.before.id)
            if now is None:
                held = self._instances.get(ch.before.id)
                now = held.version if held is not None else None
            if now != ch.before.version:
                raise StateConflict(
                    f"instance {ch.before.id} moved past version {ch.before.version}"
                )
            versions[ch.before.id] = ch.after.version

    def _apply(self, changes: Sequence[Change]) -> None:
        # Created records first, then the changes in order (as the SQL batch writes them).
        for ch in changes:
            if ch.before is None:
                self._order[ch.after.id] = next(self._seq)
                self._instances[ch.after.id] = ch.after
        for ch in changes:
            if ch.before is not None:
                self._instances[ch.after.id] = ch.after
        if self._changes is not None:
            self._changes.extend(changes)
        if self.write_contracts:
            self.contracts.record(changes)
        for ch in changes:
            self._remember(ch)
            event = event_of(ch)
            self._outbox.setdefault(event.event_id, event)

    def _remember(self, ch: Change) -> None:
        after = ch.after
        row = len(self._history)
        self._history.append(
            HistoryRow(
                instance_id=after.id,
                partition=after.partition,
                pool=after.pool,
                at=ch.at,
                from_state=ch.before.state.value if ch.before else None,
                to_state=after.state.value,
                trigger=ch.trigger.value if ch.trigger else None,
                reason=ch.reason,
                code=ch.code or None,
            )
        )
        if ch.trigger in _RECLAIMS:
            bisect.insort(self._reclaims, (ch.at, row, after.pool, after.id))

    # ------------------------------------------------------------ reservations

    def reserve(self, request: NewRequest, fence: int = 0) -> None:
        res = request.reservation
        row = self._pools.get(res.pool)
        if row is None or row.version != request.pool_version:
            raise StateConflict(f"pool {res.pool} changed since version {request.pool_version}")
        self.leases.check({res.partition, *(i.partition for i in request.instances)}, fence)
        if res.request_id in self._reservations:
            raise StateConflict(f"reservation {res.request_id} exists")
        changes = [created(i, i.reason, code=i.reason) for i in request.instances]
        self._check(changes)
        row.version += 1
        self._reservations[res.request_id] = res
        self._apply(changes)

    def settle_reservation(self, request_id: str, count: int) -> None:
        self._settle(request_id, count)

    def _settle(self, request_id: str, count: int) -> None:
        if count <= 0:
            self._reservations.pop(request_id, None)
        elif request_id in self._reservations:
            self._reservations[request_id] = replace(self._reservations[request_id], count=count)

    def reservations(self) -> list[Reservation]:
        return list(self._reservations.values())

    def sweep_reservations(self, now: float) -> int:
        gone = [k for k, r in self._reservations.items() if r.expires_at <= now]
        for k in gone:
            del self._reservations[k]
        return len(gone)

    # ------------------------------------------------------------ plans

    def changes(self) -> Sequence[Change]:
        """Every change recorded, in order (kept only with `keep_changes`)."""
        if self._changes is None:
            raise ValueError("this store keeps no changes (keep_changes=False)")
        return self._changes

    def plans(self) -> list[Plan]:
        """Every plan saved, by partition and generation."""
        return [p[g] for _, p in sorted(self._plans.items()) for g in sorted(p)]

    def latest_plan(self, partition: str) -> Plan | None:
        plans = self._plans.get(partition)
        return plans[max(plans)] if plans else None

    def save_plan(self, plan: Plan, fence: int = 0) -> None:
        self.leases.check({plan.partition}, fence)
        plans = self._plans.setdefault(plan.partition, {})
        if plan.generation in plans:
            raise StateConflict(f"plan generation {plan.generation} of {plan.partition} exists")
        plans[plan.generation] = plan

    # ------------------------------------------------------------ reading back

    def history(self, instance_id: str | None = None) -> list[HistoryRow]:
        if instance_id is None:
            return list(self._history)
        return [h for h in self._history if h.instance_id == instance_id]

    def lives(self) -> list[tuple[str, str | None, str]]:
        return [(i.id, i.server_id, i.state.value) for i in self._instances.values()]

    def state_of_server(self, server_id: str) -> str | None:
        for i in self._instances.values():
            if i.server_id == server_id:
                return i.state.value
        return None

    def counts(self) -> FleetCounts:
        by_state = Counter(i.state.value for i in self._instances.values())
        plans = sum(len(p) for p in self._plans.values())
        return FleetCounts(dict(by_state), len(self._history), plans, len(self._reservations))

    # ------------------------------------------------------------ outbox

    def emit(self, events: Sequence[LifecycleEvent]) -> None:
        for e in events:
            self._outbox.setdefault(e.event_id, e)

    def relay_outbox(self, append: Callable[[list[LifecycleEvent]], None], limit: int) -> int:
        batch = list(itertools.islice(self._outbox.values(), limit))
        if not batch:
            return 0
        append(batch)  # raises: the events stay for the next try
        for e in batch:
            del self._outbox[e.event_id]
        return len(batch)

    def outbox_size(self) -> int:
        return len(self._outbox)

    # ------------------------------------------------------------ signals

    def exclusions(self) -> dict[PoolId, Exclusion]:
        return dict(self._exclusions)

    def put_exclusion(self, exclusion: Exclusion, event: LifecycleEvent) -> Exclusion:
        held = self._exclusions.get(exclusion.pool)
        if exclusion.version == 0 and held is not None:
            raise StateConflict(f"exclusion of {exclusion.pool} exists")
        if exclusion.version != 0 and (held is None or held.version != exclusion.version):
            raise StateConflict(f"exclusion of {exclusion.pool} moved")
        saved = replace(exclusion, version=exclusion.version + 1)
        self._exclusions[exclusion.pool] = saved
        self._outbox.setdefault(event.event_id, event)
        return saved

    def save_scores(self, scores: Sequence[PoolScore], keep: int = 288) -> int:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        generation = self._newest + 1
        if scores:
            self._scores[generation] = {
                sc.pool: replace(sc, generation=generation) for sc in scores
            }
            self._newest = generation
        for g in [g for g in self._scores if g <= generation - keep]:
            del self._scores[g]
        if self._newest not in self._scores:
            self._newest = max(self._scores, default=0)
        return generation

    def latest_scores(self) -> dict[PoolId, PoolScore]:
        return dict(self._scores[self._newest]) if self._scores else {}

    def signal_stamp(self) -> tuple[int, int, float, int]:
        ages = [row.up_since for row in self._pools.values() if row.up_since is not None]
        return (
            sum(e.version for e in self._exclusions.values()),
            self._newest,
            sum(ages) + len(ages),
            len(self._intents) * 1_000_003 + sum(len(p) for p in self._intents),
        )

    def reclaims_since(self, since: float) -> list[tuple[PoolId, str, float]]:
        start = bisect.bisect_left(self._reclaims, (since,))
        return [(pool, inst, at) for at, _row, pool, inst in self._reclaims[start:]]

    def pool_ages(self) -> dict[PoolId, float | None]:
        return {pid: row.up_since for pid, row in self._pools.items()}

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool:
        row = self._pools.get(pool)
        if row is None or (row.up_since is None) == (up_since is None):
            return False
        row.up_since = up_since
        return True

    def live_per_pool(self) -> dict[PoolId, int]:
        return dict(Counter(i.pool for i in self._instances.values() if i.state in LIVE))

    # ------------------------------------------------------------ intents

    def put_intent(self, partition: str, intent: str, at: float, by: str) -> None:
        self._intents.pop(partition, None)
        self._intents[partition] = (intent, at, by)

    def drop_intent(self, partition: str) -> bool:
        return self._intents.pop(partition, None) is not None

    def intents(self) -> dict[str, str]:
        return {p: intent for p, (intent, _at, _by) in self._intents.items()}

    def intent_rows(self) -> dict[str, tuple[str, float, str]]:
        """Each partition's intent, when it was given and by whom."""
        return dict(self._intents)
