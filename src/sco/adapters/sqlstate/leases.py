"""Partition leases as rows of the fleet-state database (SQLite or PostgreSQL).

Every change is one conditional UPDATE or INSERT, so two replicas racing for
a lease cannot both win: the database serialises them. A new holder always
gets a larger token; the fencing triggers of migration 0003 then refuse any
write carrying an older one. Times are the callers' clocks: replicas must
keep them within a small fraction of the TTL of each other (NTP does).
"""

from __future__ import annotations

from sqlalchemy import Engine, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from sco.adapters.sqlstate import schema as t
from sco.ports import Lease, StateConflict

# Built once: every replica renews every lease each second, and building a statement
# costs more than running it on SQLite.
_L = t.leases.c
_EXTEND = (
    update(t.leases)
    .where(
        _L.partition == bindparam("p"),
        _L.holder == bindparam("h"),
        _L.expires_at >= bindparam("now"),
    )
    .values(expires_at=bindparam("until"))
    .returning(_L.token)
)
_TAKE = (
    update(t.leases)
    .where(_L.partition == bindparam("p"), _L.expires_at < bindparam("now"))
    .values(
        holder=bindparam("h"),
        token=_L.token + 1,
        acquired_at=bindparam("now"),
        expires_at=bindparam("until"),
    )
    .returning(_L.token)
)
_RENEW = (
    update(t.leases)
    .where(
        _L.partition == bindparam("p"),
        _L.holder == bindparam("h"),
        _L.token == bindparam("tok"),
        _L.expires_at >= bindparam("now"),
    )
    .values(expires_at=bindparam("until"))
)
_SEEN = select(_L.token, _L.holder, _L.expires_at).where(_L.partition == bindparam("p"))
_R = t.replicas.c
_BEAT = update(t.replicas).where(_R.name == bindparam("n")).values(expires_at=bindparam("until"))
_LIVE = select(_R.name).where(_R.expires_at >= bindparam("now")).order_by(_R.name)


class SqlLeases:
    """`sco.ports.LeaseStore` on the fleet-state database: leases on the `leases` table,
    replica heartbeats on `replicas`, and fencing (the `leases` table's tokens are what
    the fencing triggers compare every write with). With leases kept in Kubernetes, its
    fencing still serves (`claim_fence`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def acquire(self, partition: str, holder: str, ttl_s: float, now: float) -> Lease | None:
        args = {"p": partition, "h": holder, "now": now, "until": now + ttl_s}
        with self.engine.begin() as conn:
            mine = conn.execute(_EXTEND, args).first()
            if mine is not None:
                return Lease(partition, holder, int(mine.token), now + ttl_s)
            taken = conn.execute(_TAKE, args).first()
            if taken is not None:
                return Lease(partition, holder, int(taken.token), now + ttl_s)
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(t.leases).values(
                        partition=partition,
                        holder=holder,
                        token=1,
                        acquired_at=now,
                        expires_at=now + ttl_s,
                    )
                )
        except IntegrityError:
            return None  # someone else holds it
        return Lease(partition, holder, 1, now + ttl_s)

    def renew(self, lease: Lease, ttl_s: float, now: float) -> Lease | None:
        args = {
            "p": lease.partition,
            "h": lease.holder,
            "tok": lease.token,
            "now": now,
            "until": now + ttl_s,
        }
        with self.engine.begin() as conn:
            done = conn.execute(_RENEW, args)
        if done.rowcount != 1:
            return None
        return Lease(lease.partition, lease.holder, lease.token, now + ttl_s)

    def release(self, lease: Lease) -> None:
        """Expire it at once, with no holder (handed back, not orphaned by a death); the
        row (and its token) stays, so the next holder's token is still larger."""
        row = t.leases.c
        with self.engine.begin() as conn:
            conn.execute(
                update(t.leases)
                .where(
                    row.partition == lease.partition,
                    row.holder == lease.holder,
                    row.token == lease.token,
                )
                .values(expires_at=-1.0, holder="")
            )

    def leases(self) -> list[Lease]:
        with self.engine.connect() as conn:
            return [
                Lease(r.partition, r.holder, int(r.token), float(r.expires_at))
                for r in conn.execute(select(t.leases).order_by(t.leases.c.partition))
            ]

    def claim_fence(
        self, partition: str, holder: str, token: int, until: float, now: float
    ) -> int | None:
        """The fencing token `holder` writes `partition` with (`sco.ports.Fencing`).
        With leases kept here the lease row is the claim, and the holder's already. A
        lease kept elsewhere may count from 1 again (a Kubernetes Lease recreated, or
        leases moved from the database to Kubernetes) while the database still refuses
        every token below the largest it saw: a new holder writes above it, and every
        older holder stays refused. The claim is a live lease row to replicas whose
        leases are kept here (a rolling change of lease kind): they do not take it
        until it expires, nor it theirs. The triggers of migration 0003 refuse any
        write of the partition's rows below what this returns."""
        row = t.leases.c
        with self.engine.begin() as conn:
            seen = conn.execute(_SEEN, {"p": partition}).first()
            if seen is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(t.leases).values(
                                partition=partition,
                                holder=holder,
                                token=token,
                                acquired_at=now,
                                expires_at=until,
                            )
                        )
                    return token
                except IntegrityError:  # another holder's claim came first
                    seen = conn.execute(_SEEN, {"p": partition}).one()
            mine = seen.holder == holder and int(seen.token) >= token
            if not mine and seen.holder and float(seen.expires_at) >= now:
                return None  # another replica's claim, live
            fence = int(seen.token) if mine else max(token, int(seen.token) + 1)
            claimed = conn.execute(
                update(t.leases)
                .where(row.partition == partition, row.token == seen.token)
                .values(
                    token=fence,
                    holder=holder,
                    expires_at=max(until, float(seen.expires_at)) if mine else until,
                )
            )
            if claimed.rowcount != 1:
                raise StateConflict(f"the fence of {partition} moved while {holder} claimed it")
            return fence

    def release_fence(self, partition: str, holder: str) -> None:
        row = t.leases.c
        with self.engine.begin() as conn:
            conn.execute(
                update(t.leases)
                .where(row.partition == partition, row.holder == holder)
                .values(expires_at=-1.0, holder="")
            )

    # ------------------------------------------------------------ replicas

    def heartbeat(self, name: str, ttl_s: float, now: float) -> None:
        """Say this replica is alive until now + ttl_s."""
        row = t.replicas.c
        with self.engine.begin() as conn:
            done = conn.execute(_BEAT, {"n": name, "until": now + ttl_s})
            if done.rowcount == 0:
                try:
                    with conn.begin_nested():
                        conn.execute(insert(t.replicas).values(name=name, expires_at=now + ttl_s))
                except IntegrityError:
                    conn.execute(
                        update(t.replicas).where(row.name == name).values(expires_at=now + ttl_s)
                    )

    def live_replicas(self, now: float) -> list[str]:
        with self.engine.connect() as conn:
            return [r.name for r in conn.execute(_LIVE, {"now": now})]

    def forget_replica(self, name: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(t.replicas).where(t.replicas.c.name == name))

    def lapse(self, holder: str) -> None:
        """What a holder that died without a word leaves: its heartbeat and its leases
        run out, unreleased (for the swarm's faults and for tests)."""
        with self.engine.begin() as conn:
            conn.execute(update(t.leases).where(t.leases.c.holder == holder).values(expires_at=0.0))
            conn.execute(
                update(t.replicas).where(t.replicas.c.name == holder).values(expires_at=0.0)
            )
