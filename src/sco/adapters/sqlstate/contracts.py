"""Node contracts in fleet state: written with the transitions that change them, read
by the distributor (by token hash) and by the controller (acknowledgements).

A contract's version grows only when its terms change (`sco.domain.contracts`).
Every new version is also a row of `contract_changes`, whose growing id lets the
distributor's replicas ask "what changed since" cheaply; on PostgreSQL the
same transaction sends a NOTIFY so they do not even have to ask.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, and_, delete, func, insert, or_, select, text, update

from sco.adapters.sqlstate import DatabaseError, Unreachable
from sco.adapters.sqlstate import schema as t
from sco.domain.contracts import AckStatus, NodeState, StoredContract, Terms, terms_of
from sco.domain.instances import Change
from sco.ports import FencedOut
from sco.ports.contracts import ContractsUnavailable, Listener

CHANNEL = "sco_contracts"
log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class FeedUnavailable(ContractsUnavailable, DatabaseError):
    """The database failed under one of the distributor's reads or acknowledgements:
    the port's error for the distributor, and still a DatabaseError for the callers
    here that catch those (an operator's command reading fleet state)."""


def _feed(method: Callable[P, R]) -> Callable[P, R]:
    """A `ContractFeed` method: a database failure under it is `FeedUnavailable`.
    Its message is the failure's kind, and for a database that cannot be reached the
    driver's first line; never SQLAlchemy's own message, which quotes the statement
    and its parameters (a token's digest among them)."""

    @functools.wraps(method)
    def answer(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except FeedUnavailable:
            raise
        except DatabaseError as e:
            why = type(e).__name__
            if isinstance(e, Unreachable):
                first = next(iter(str(e.orig).splitlines()), "")
                why += f": {first}" if first else ""
            raise FeedUnavailable(f"fleet state: {why}") from e

    return answer


def record_contracts(conn: Connection, changes: Sequence[Change]) -> None:
    """Upsert the contracts `changes` touch, in the caller's transaction."""
    moved: list[str] = []
    for ch in changes:
        after = terms_of(ch.after)
        values = _terms_row(after) | {"server_id": ch.after.server_id, "changed_at": ch.at}
        if ch.before is not None:
            same = terms_of(ch.before) == after and ch.before.server_id == ch.after.server_id
            if same:
                continue
            done = conn.execute(
                update(t.contracts)
                .where(t.contracts.c.instance_id == ch.after.id)
                .values(version=t.contracts.c.version + 1, **values)
            )
            if done.rowcount:
                moved.append(ch.after.id)
                continue
        conn.execute(insert(t.contracts).values(instance_id=ch.after.id, version=1, **values))
        moved.append(ch.after.id)
    _changed(conn, moved, time.time())  # wall time: replicas prune by it


def _changed(conn: Connection, instance_ids: Sequence[str], at: float) -> None:
    """Log contracts that changed, in the caller's transaction; on PostgreSQL the
    NOTIFY goes out when it commits."""
    if not instance_ids:
        return
    conn.execute(insert(t.contract_changes), [{"instance_id": i, "at": at} for i in instance_ids])
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_notify(:c, '')"), {"c": CHANNEL})


def _terms_row(terms: Terms) -> dict[str, object]:
    return {
        "partition": terms.partition,
        "pool": terms.pool,
        "capacity_class": terms.capacity_class,
        "plan_generation": terms.plan_generation,
        "state": str(terms.state),
        "drain_by": terms.drain_by,
        "reclaim": terms.reclaim,
    }


def _row(r: Any) -> StoredContract:
    return StoredContract(
        instance_id=r.instance_id,
        version=int(r.version),
        terms=Terms(
            partition=r.partition,
            pool=r.pool,
            capacity_class=r.capacity_class,
            plan_generation=int(r.plan_generation),
            state=NodeState(r.state),
            drain_by=r.drain_by,
            reclaim=bool(r.reclaim),
        ),
        server_id=r.server_id,
        changed_at=float(r.changed_at),
        token_expires_at=r.token_expires_at,
        ack_version=r.ack_version,
        ack_status=AckStatus(r.ack_status) if r.ack_status else None,
        ack_detail=r.ack_detail,
        ack_at=r.ack_at,
        token_hash=r.token_hash,
        prev_token_hash=r.prev_token_hash,
        prev_token_expires_at=r.prev_token_expires_at,
        delivered_token_hash=r.delivered_token_hash,
        delivered_token_expires_at=r.delivered_token_expires_at,
    )


class ContractStore:
    """Contracts of one fleet state database: every role of `sco.ports.Contracts`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def listener(self) -> Listener | None:
        """How to hear of changes as they commit: on PostgreSQL, LISTEN for the
        NOTIFY each change sends; elsewhere None (ask `changed_since` now and then)."""
        if self.engine.dialect.name != "postgresql":
            return None
        return self._listen

    def _listen(self, poke: Callable[[], None], stop: threading.Event) -> None:
        # psycopg's blocking generator, with a timeout to notice `stop`.
        while not stop.is_set():
            try:
                raw = self.engine.raw_connection()
                try:
                    conn: Any = raw.driver_connection
                    conn.autocommit = True
                    conn.execute(f"LISTEN {CHANNEL}")
                    poke()  # anything missed while not listening
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            poke()
                finally:
                    raw.invalidate()
            except Exception as e:
                log.warning("distributor: LISTEN %s lost (%s); again in 2 s", CHANNEL, e)
                stop.wait(2.0)

    @_feed
    def get(self, instance_id: str) -> StoredContract | None:
        q = select(t.contracts).where(t.contracts.c.instance_id == instance_id)
        with self.engine.connect() as conn:
            r = conn.execute(q).first()
        return _row(r) if r is not None else None

    @_feed
    def get_many(self, instance_ids: Sequence[str]) -> dict[str, StoredContract]:
        out: dict[str, StoredContract] = {}
        ids = list(instance_ids)
        with self.engine.connect() as conn:
            for k in range(0, len(ids), 1000):
                q = select(t.contracts).where(t.contracts.c.instance_id.in_(ids[k : k + 1000]))
                out.update((r.instance_id, _row(r)) for r in conn.execute(q))
        return out

    @_feed
    def by_token(self, token_hash: str, now: float) -> StoredContract | None:
        """The contract whose token, the token that one replaced, or the token last
        seen delivered hashes to `token_hash` and has not expired."""
        c = t.contracts.c
        q = select(t.contracts).where(
            or_(
                and_(c.token_hash == token_hash, c.token_expires_at > now),
                and_(c.prev_token_hash == token_hash, c.prev_token_expires_at > now),
                and_(c.delivered_token_hash == token_hash, c.delivered_token_expires_at > now),
            )
        )
        with self.engine.connect() as conn:
            r = conn.execute(q).first()
        return _row(r) if r is not None else None

    @_feed
    def of_partition(self, partition: str) -> list[StoredContract]:
        q = select(t.contracts).where(t.contracts.c.partition == partition)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def untokened(
        self, partition: str, renew_before: float, undelivered_before: float
    ) -> list[tuple[str, str]]:
        c = t.contracts.c
        q = select(c.instance_id, c.server_id).where(
            c.partition == partition,
            c.server_id.is_not(None),
            c.state != str(NodeState.GONE),
            or_(
                c.token_hash.is_(None),
                c.token_expires_at < renew_before,
                and_(c.token_delivered.is_(False), c.token_set_at < undelivered_before),
            ),
        )
        with self.engine.connect() as conn:
            return [(str(i), str(s)) for i, s in conn.execute(q)]

    def drained_servers(self, partition: str) -> set[str]:
        c = t.contracts.c
        q = select(c.server_id).where(
            c.partition == partition,
            c.state == str(NodeState.LEAVING),
            c.ack_version == c.version,
            c.ack_status.in_([str(AckStatus.DRAINED), str(AckStatus.LEFT)]),
        )
        with self.engine.connect() as conn:
            return {str(sid) for (sid,) in conn.execute(q) if sid}

    def revoke(self, partition: str, instance_id: str | None = None) -> int:
        """Drop tokens (all of a partition's, or one instance's): the controller issues
        new ones on its next cycle, and the old ones stop working at once."""
        c = t.contracts.c
        where = [c.partition == partition]
        if instance_id is not None:
            where.append(c.instance_id == instance_id)
        with self.engine.begin() as conn:
            ids = [
                r.instance_id
                for r in conn.execute(
                    update(t.contracts)
                    .where(*where)
                    .values(
                        token_hash=None,
                        token_expires_at=None,
                        prev_token_hash=None,
                        prev_token_expires_at=None,
                        delivered_token_hash=None,
                        delivered_token_expires_at=None,
                    )
                    .returning(c.instance_id)
                )
            ]
            _changed(conn, ids, time.time())
        return len(ids)

    def set_token(
        self, instance_id: str, token_hash: str, expires_at: float, now: float, fence: int = 0
    ) -> bool:
        """Store a new token's digest, before the token is delivered (`sco.ports.
        TokenLedger`); the token it replaces is accepted until its own expiry. False when
        there is no such contract, or another writer set one since it was read; FencedOut
        when `fence` is below the partition's lease token."""
        c, lease = t.contracts.c, t.leases.c
        with self.engine.begin() as conn:
            row = conn.execute(
                select(c.partition, c.token_hash, c.token_expires_at).where(
                    c.instance_id == instance_id
                )
            ).first()
            if row is None:
                return False
            # Read for share: a new holder's claim waits for this write, or this write
            # sees the claim (PostgreSQL; SQLite writes one at a time anyway).
            current = conn.execute(
                select(lease.token)
                .where(lease.partition == row.partition)
                .with_for_update(read=True)
            ).scalar()
            if current is not None and fence < int(current):
                raise FencedOut(
                    f"stale fencing token: {fence} < current token {current} of {row.partition}"
                )
            replaced = row.token_expires_at is not None and row.token_expires_at > now
            done = conn.execute(
                update(t.contracts)
                .where(
                    c.instance_id == instance_id, c.token_hash.is_not_distinct_from(row.token_hash)
                )
                .values(
                    token_hash=token_hash,
                    token_expires_at=expires_at,
                    prev_token_hash=row.token_hash if replaced else None,
                    prev_token_expires_at=row.token_expires_at if replaced else None,
                    token_set_at=now,
                    token_delivered=False,
                )
            )
            if done.rowcount:
                _changed(conn, [instance_id], time.time())
        return bool(done.rowcount)

    def token_delivered(self, instance_id: str, token_hash: str) -> None:
        c = t.contracts.c
        with self.engine.begin() as conn:
            conn.execute(
                update(t.contracts)
                .where(c.instance_id == instance_id, c.token_hash == token_hash)
                .values(
                    token_delivered=True,
                    delivered_token_hash=c.token_hash,
                    delivered_token_expires_at=c.token_expires_at,
                )
            )

    @_feed
    def ack(
        self, instance_id: str, version: int, status: AckStatus, detail: str, at: float
    ) -> bool:
        """Record the agent's answer to `version`; False when that is not the current one."""
        c = t.contracts.c
        with self.engine.begin() as conn:
            done = conn.execute(
                update(t.contracts)
                .where(c.instance_id == instance_id, c.version == version)
                .values(ack_version=version, ack_status=str(status), ack_detail=detail, ack_at=at)
            )
        return bool(done.rowcount)

    @_feed
    def current(self, gone_since: float) -> list[StoredContract]:
        """Every contract a node may still ask for: not gone, or gone since `gone_since`."""
        c = t.contracts.c
        q = select(t.contracts).where(
            or_(c.state != str(NodeState.GONE), c.changed_at >= gone_since)
        )
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    @_feed
    def prune_changes(self, before: float) -> int:
        with self.engine.begin() as conn:
            done = conn.execute(delete(t.contract_changes).where(t.contract_changes.c.at < before))
        return int(done.rowcount or 0)

    @_feed
    def last_change(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.max(t.contract_changes.c.id))).scalar() or 0)

    @_feed
    def changed_since(self, after: int, limit: int = 50_000) -> tuple[int, set[str]]:
        """(the latest change id, the instances whose contracts changed after `after`)."""
        c = t.contract_changes.c
        q = select(c.id, c.instance_id).where(c.id > after).order_by(c.id).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        if not rows:
            return after, set()
        return int(rows[-1].id), {r.instance_id for r in rows}
