"""FleetStore on SQLAlchemy 2 Core: SQLite by default, PostgreSQL with the same code.

Every state change is an UPDATE guarded by the row's version (compare-and-swap)
and one history row, in one transaction. Reservations bump the pool row's
version in the same transaction, so two writers cannot both spend the same
headroom.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError

from sco.adapters.sqlstate import rows
from sco.adapters.sqlstate import schema as t
from sco.adapters.sqlstate.contracts import ContractStore, record_contracts
from sco.adapters.sqlstate.engine import migrate, open_engine
from sco.adapters.sqlstate.signals import SqlSignals
from sco.domain.events import LifecycleEvent, event_of, parse_event
from sco.domain.instances import Change, Instance, created
from sco.domain.lifecycle import State
from sco.domain.plans import Plan, PoolReason
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import Exclusion, PoolScore
from sco.ports import (
    FencedOut,
    FleetCounts,
    HistoryRow,
    NewRequest,
    PoolRecord,
    Reservation,
    StateConflict,
)

# Built once: the hot paths reuse SQLAlchemy's compiled form instead of
# constructing a statement per row.
_LIVE_INSTANCES = select(t.instances).where(
    t.instances.c.partition == bindparam("p"), t.instances.c.state != State.GONE.value
)
_INSERT_INSTANCE = insert(t.instances)
_UPDATE_INSTANCE = update(t.instances).where(
    t.instances.c.id == bindparam("b_id"), t.instances.c.version == bindparam("b_version")
)
_INSERT_HISTORY = insert(t.instance_history)
_INSERT_OUTBOX = insert(t.outbox)
_DROP_RESERVATION = delete(t.reservations).where(t.reservations.c.request_id == bindparam("rid"))
# Settling is not fenced (the port's `settle_reservation` takes no token, and a drop is
# a DELETE, which no trigger fences): a shrink takes its partition's token, so the
# fencing trigger lets it through whatever token the reservation was made with.
_SHRINK_RESERVATION = (
    update(t.reservations)
    .where(t.reservations.c.request_id == bindparam("rid"))
    .values(
        count=bindparam("n"),
        fence=func.coalesce(
            select(t.leases.c.token)
            .where(t.leases.c.partition == t.reservations.c.partition)
            .scalar_subquery(),
            t.reservations.c.fence,
        ),
    )
)


class SqlFleetStore:
    """Fleet state behind the FleetStore port: records, reservations, plans and the
    outbox here; the pools' signals and operators' intents are `SqlSignals`'s, which
    it holds (`signals`) and answers for; the contracts are `ContractStore`'s."""

    def __init__(
        self,
        url: str,
        *,
        run_migrations: bool = True,
        contracts: bool = True,
        outbox: bool = True,
    ) -> None:
        """Every partition-owned row a write makes (records, reservations, plans)
        carries the write's fencing token, and the database refuses one older than the
        partition's current lease (`FencedOut`, migration 0003's triggers). Without
        `contracts` (a simulation: no node reads one) transitions write none; without
        `outbox` (a lab run's copy: its events went to the run's own log) transitions
        put no event in the outbox."""
        self.url = url
        self.write_contracts = contracts
        self.write_outbox = outbox
        self.engine = open_engine(url)
        if run_migrations:
            migrate(self.engine)
        self.contracts = ContractStore(self.engine)
        self.signals = SqlSignals(self.engine)
        dialect = sqlite if self.engine.dialect.name == "sqlite" else postgresql
        self._emit = dialect.insert(t.outbox).on_conflict_do_nothing(index_elements=["event_id"])

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------ signals and intents

    def exclusions(self) -> dict[PoolId, Exclusion]:
        return self.signals.exclusions()

    def put_exclusion(self, exclusion: Exclusion, event: LifecycleEvent) -> Exclusion:
        return self.signals.put_exclusion(exclusion, event)

    def save_scores(self, scores: Sequence[PoolScore], keep: int = 288) -> int:
        return self.signals.save_scores(scores, keep)

    def latest_scores(self) -> dict[PoolId, PoolScore]:
        return self.signals.latest_scores()

    def signal_stamp(self) -> tuple[int, int, float, int]:
        return self.signals.signal_stamp()

    def reclaims_since(self, since: float) -> list[tuple[PoolId, str, float]]:
        return self.signals.reclaims_since(since)

    def pool_ages(self) -> dict[PoolId, float | None]:
        return self.signals.pool_ages()

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool:
        return self.signals.set_pool_age(pool, up_since)

    def live_per_pool(self) -> dict[PoolId, int]:
        return self.signals.live_per_pool()

    def put_intent(self, partition: str, intent: str, at: float, by: str) -> None:
        self.signals.put_intent(partition, intent, at, by)

    def drop_intent(self, partition: str) -> bool:
        return self.signals.drop_intent(partition)

    def intents(self) -> dict[str, str]:
        return self.signals.intents()

    def schema_revision(self) -> str | None:
        """The Alembic revision the database's schema stands at."""
        with self.engine.connect() as conn:
            rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return str(rev) if rev is not None else None

    # ------------------------------------------------------------ pools

    def upsert_pools(self, pools: Sequence[Pool]) -> None:
        # One statement per pool, not a read then a write: replicas that start together
        # write the same pools at once (the second one's INSERT crashed it).
        dialect = sqlite if self.engine.dialect.name == "sqlite" else postgresql
        with self.engine.begin() as conn:
            for p in pools:
                values = rows.pool_row(p)
                row = dialect.insert(t.pools).values(id=p.id, version=0, **values)
                conn.execute(row.on_conflict_do_update(index_elements=["id"], set_=values))

    def pool_records(self) -> Mapping[PoolId, PoolRecord]:
        with self.engine.connect() as conn:
            versions = conn.execute(select(t.pools.c.id, t.pools.c.version)).all()
            sums = select(t.reservations.c.pool, func.sum(t.reservations.c.count)).group_by(
                t.reservations.c.pool
            )
            reserved: dict[str, int] = {pool: int(n or 0) for pool, n in conn.execute(sums)}
        return {pid: PoolRecord(int(v), int(reserved.get(pid) or 0)) for pid, v in versions}

    def pools(self) -> list[Pool]:
        with self.engine.connect() as conn:
            return [rows.pool_of(r) for r in conn.execute(select(t.pools))]

    # ------------------------------------------------------------ instances

    def instances(self, partition: str) -> list[Instance]:
        with self.engine.connect() as conn:
            return [rows.instance_of(r) for r in conn.execute(_LIVE_INSTANCES, {"p": partition})]

    def server_classes(self, partition: str) -> dict[str, str]:
        """Capacity class by server id of every server the partition ever had."""
        q = select(t.instances.c.server_id, t.instances.c.capacity_class).where(
            t.instances.c.partition == partition, t.instances.c.server_id.is_not(None)
        )
        with self.engine.connect() as conn:
            return {str(sid): str(cls) for sid, cls in conn.execute(q)}

    def server_ids(self, instance_ids: Iterable[str]) -> dict[str, str]:
        """The server of each instance that had one (gone ones included)."""
        wanted = sorted(set(instance_ids))
        if not wanted:
            return {}
        q = select(t.instances.c.id, t.instances.c.server_id).where(
            t.instances.c.id.in_(wanted), t.instances.c.server_id.is_not(None)
        )
        with self.engine.connect() as conn:
            return {str(i): str(s) for i, s in conn.execute(q)}

    def instance(self, instance_id: str) -> Instance | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(t.instances).where(t.instances.c.id == instance_id)).first()
            return rows.instance_of(r) if r else None

    def record(
        self, changes: Sequence[Change], settle: Mapping[str, int] | None = None, fence: int = 0
    ) -> None:
        if not changes and not settle:
            return
        with fenced(taken_is_conflict=True), self.engine.begin() as conn:
            if changes:
                _record(conn, changes, fence, self.write_contracts, self.write_outbox)
            for request_id, count in (settle or {}).items():
                _settle(conn, request_id, count)

    # ------------------------------------------------------------ reservations

    def reserve(self, request: NewRequest, fence: int = 0) -> None:
        res = request.reservation
        with fenced(taken_is_conflict=True), self.engine.begin() as conn:
            bumped = conn.execute(
                update(t.pools)
                .where(t.pools.c.id == res.pool, t.pools.c.version == request.pool_version)
                .values(version=t.pools.c.version + 1)
            )
            if bumped.rowcount != 1:
                raise StateConflict(f"pool {res.pool} changed since version {request.pool_version}")
            conn.execute(insert(t.reservations).values(**rows.reservation_row(res), fence=fence))
            _record(
                conn,
                [created(i, i.reason, code=i.reason) for i in request.instances],
                fence,
                self.write_contracts,
                self.write_outbox,
            )

    def settle_reservation(self, request_id: str, count: int) -> None:
        with self.engine.begin() as conn:
            _settle(conn, request_id, count)

    def reservations(self) -> list[Reservation]:
        with self.engine.connect() as conn:
            return [rows.reservation_of(r) for r in conn.execute(select(t.reservations))]

    def sweep_reservations(self, now: float) -> int:
        with self.engine.begin() as conn:
            gone = conn.execute(delete(t.reservations).where(t.reservations.c.expires_at <= now))
            return int(gone.rowcount or 0)

    # ------------------------------------------------------------ plans

    def latest_plan(self, partition: str) -> Plan | None:
        q = (
            select(t.plans)
            .where(t.plans.c.partition == partition)
            .order_by(t.plans.c.generation.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            r = conn.execute(q).first()
        if r is None:
            return None
        return Plan(
            partition=r.partition,
            generation=r.generation,
            created_at=r.created_at,
            spot=json.loads(r.spot),
            guaranteed=json.loads(r.guaranteed),
            notes=tuple(json.loads(r.notes)),
            pools={p: PoolReason.from_json(doc) for p, doc in json.loads(r.pools).items()},
            terms={k: float(v) for k, v in json.loads(r.terms).items()},
        )

    def save_plan(self, plan: Plan, fence: int = 0) -> None:
        self.save_plans([plan], fence)

    def save_plans(self, plans: Sequence[Plan], fence: int = 0) -> None:
        """Plans in one transaction (a lab run's copy writes thousands)."""
        if not plans:
            return
        try:
            with fenced(), self.engine.begin() as conn:
                conn.execute(insert(t.plans), [self._plan_row(p, fence) for p in plans])
        except IntegrityError:
            which = ", ".join(f"{p.generation} of {p.partition}" for p in plans[:3])
            raise StateConflict(f"plan generation {which} exists") from None

    def _plan_row(self, plan: Plan, fence: int) -> dict[str, Any]:
        return {
            "partition": plan.partition,
            "generation": plan.generation,
            "created_at": plan.created_at,
            "spot": _json(dict(plan.spot)),
            "guaranteed": _json(dict(plan.guaranteed)),
            "notes": _json(list(plan.notes)),
            "pools": _json({p: w.to_json() for p, w in plan.pools.items()}),
            "terms": _json(dict(plan.terms)),
            "fence": fence,
        }

    # ------------------------------------------------------------ reading back

    def history(self, instance_id: str | None = None) -> list[HistoryRow]:
        q = select(t.instance_history).order_by(t.instance_history.c.id)
        if instance_id is not None:
            q = q.where(t.instance_history.c.instance_id == instance_id)
        with self.engine.connect() as conn:
            return [rows.history_row(r) for r in conn.execute(q)]

    def lives(self) -> list[tuple[str, str | None, str]]:
        i = t.instances.c
        with self.engine.connect() as conn:
            return [(r[0], r[1], r[2]) for r in conn.execute(select(i.id, i.server_id, i.state))]

    def state_of_server(self, server_id: str) -> str | None:
        i = t.instances.c
        with self.engine.connect() as conn:
            state = conn.execute(select(i.state).where(i.server_id == server_id)).scalar()
        return str(state) if state is not None else None

    def recent_history(self, limit: int) -> list[HistoryRow]:
        """The last `limit` transitions, newest first."""
        q = select(t.instance_history).order_by(t.instance_history.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [rows.history_row(r) for r in conn.execute(q)]

    def history_since(self, since: float) -> list[HistoryRow]:
        """Every transition at or after `since`, oldest first."""
        q = select(t.instance_history).where(t.instance_history.c.at >= since)
        with self.engine.connect() as conn:
            return [rows.history_row(r) for r in conn.execute(q.order_by(t.instance_history.c.id))]

    def partitions(self) -> list[str]:
        """Every partition with instances or a plan."""
        q = select(t.instances.c.partition).union(select(t.plans.c.partition))
        with self.engine.connect() as conn:
            return sorted(str(r[0]) for r in conn.execute(q))

    def counts(self) -> FleetCounts:
        with self.engine.connect() as conn:
            by_state = {
                r.state: int(r.n)
                for r in conn.execute(
                    select(t.instances.c.state, func.count().label("n")).group_by(
                        t.instances.c.state
                    )
                )
            }
            history = conn.execute(select(func.count()).select_from(t.instance_history)).scalar()
            plans = conn.execute(select(func.count()).select_from(t.plans)).scalar()
            res = conn.execute(select(func.count()).select_from(t.reservations)).scalar()
        return FleetCounts(by_state, int(history or 0), int(plans or 0), int(res or 0))

    # ------------------------------------------------------------ outbox

    def outbox_batch(self, limit: int) -> list[tuple[int, LifecycleEvent]]:
        """The oldest unrelayed events with their outbox ids (to look at; relays use
        `relay_outbox`)."""
        q = select(t.outbox.c.id, t.outbox.c.payload).order_by(t.outbox.c.id).limit(limit)
        with self.engine.connect() as conn:
            return [(r.id, parse_event(r.payload)) for r in conn.execute(q)]

    def emit(self, events: Sequence[LifecycleEvent]) -> None:
        """Put events in the outbox; an event id already there is skipped, so replicas
        that emit the same sample (its id names pool and period) emit it once."""
        if events:
            with self.engine.begin() as conn:
                conn.execute(self._emit, [rows.outbox_row(e) for e in events])

    def relay_outbox(self, append: Callable[[list[LifecycleEvent]], None], limit: int) -> int:
        """Hand the oldest `limit` outbox events to `append` (the event log), then drop
        them, in one transaction that holds their rows: replicas relaying at once take
        different rows (PostgreSQL's SKIP LOCKED), and an `append` that raises leaves
        them for the next try. At least once: a crash after `append` relays them again,
        and readers drop event ids they have seen. Returns how many were relayed."""
        q = select(t.outbox.c.id, t.outbox.c.payload).order_by(t.outbox.c.id).limit(limit)
        if self.engine.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        with self.engine.begin() as conn:
            rows = conn.execute(q).all()
            if not rows:
                return 0
            append([parse_event(r.payload) for r in rows])
            conn.execute(delete(t.outbox).where(t.outbox.c.id.in_([r.id for r in rows])))
        return len(rows)

    def outbox_size(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(t.outbox)).scalar() or 0)


# ---------------------------------------------------------------- writes


def _json(doc: object) -> str:
    """`doc` as JSON, keys sorted: orjson's (a lab run's copy writes thousands of
    plans), but where it wrote null for a value that is not finite, the standard
    library's, which keeps it (Infinity, NaN) as `json.loads` reads it back."""
    out = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    if b"null" in out:
        return json.dumps(doc, sort_keys=True)
    return out.decode()


@contextmanager
def fenced(taken_is_conflict: bool = False) -> Iterator[None]:
    """Turn the fencing trigger's refusal into FencedOut, and (`taken_is_conflict`) a
    row whose key another write took first into StateConflict: a record created twice
    is a lost race like a stale version."""
    try:
        yield
    except (IntegrityError, DBAPIError) as e:
        why = str(e.orig if hasattr(e, "orig") else e)
        if "stale fencing token" in why:
            raise FencedOut(why.splitlines()[0]) from None
        if taken_is_conflict and isinstance(e, IntegrityError):
            raise StateConflict(f"a key written twice: {why.splitlines()[0]}") from None
        raise


def _record(
    conn: Connection,
    changes: Sequence[Change],
    fence: int,
    contracts: bool = True,
    outbox: bool = True,
) -> None:
    history: list[dict[str, Any]] = []
    # One write per record: a batch may move a record more than once (created, then
    # answered; CREATING to READY in one sync). Its history keeps every step; its row
    # takes the last, compared against the version before the first.
    first: dict[str, Change] = {}
    last: dict[str, Instance] = {}
    for ch in changes:
        iid = ch.after.id
        before = last.get(iid)
        if before is not None and (ch.before is None or ch.before.version != before.version):
            raise StateConflict(f"instance {iid} changed twice from version {before.version}")
        first.setdefault(iid, ch)
        last[iid] = ch.after
        history.append(rows.transition_row(ch))
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for iid, ch in first.items():
        row = rows.instance_row(last[iid])
        row["fence"] = fence
        if ch.before is None:
            inserts.append(row)
        else:
            row["b_id"], row["b_version"] = ch.before.id, ch.before.version
            updates.append(row)
    if inserts:
        conn.execute(_INSERT_INSTANCE, inserts)
    _compare_and_swap(conn, updates)
    if history:
        conn.execute(_INSERT_HISTORY, history)
        if outbox:
            conn.execute(_INSERT_OUTBOX, [rows.outbox_row(event_of(ch)) for ch in changes])
        if contracts:
            record_contracts(conn, changes)


def _compare_and_swap(conn: Connection, updates: list[dict[str, Any]]) -> None:
    """Each row updates only the version it was read at, or the transaction fails. A
    cycle's updates go as one batch where the driver sums the rows a batch touched."""
    if not updates:
        return
    if len(updates) > 1 and conn.dialect.supports_sane_multi_rowcount:
        if conn.execute(_UPDATE_INSTANCE, updates).rowcount == len(updates):
            return
        raise StateConflict(
            f"{len(updates)} instance updates: at least one moved past the version read, "
            f"among {', '.join(sorted({u['b_id'] for u in updates})[:5])}"
        )
    for row in updates:
        if conn.execute(_UPDATE_INSTANCE, row).rowcount != 1:
            raise StateConflict(f"instance {row['b_id']} moved past version {row['b_version']}")


def _settle(conn: Connection, request_id: str, count: int) -> None:
    if count <= 0:
        conn.execute(_DROP_RESERVATION, {"rid": request_id})
    else:
        conn.execute(_SHRINK_RESERVATION, {"rid": request_id, "n": count})
