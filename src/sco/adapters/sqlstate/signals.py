"""The pools' signals and operators' intents in fleet state: exclusions (compare-and-
swap on their version, with their event in the same transaction), score generations,
the pools' ages, reclaims read back from history, and one intent per partition."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Engine, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from sco.adapters.sqlstate import rows
from sco.adapters.sqlstate import schema as t
from sco.domain.events import LifecycleEvent
from sco.domain.lifecycle import LIVE
from sco.domain.pools import PoolId
from sco.domain.signals import Exclusion, PoolScore
from sco.ports import StateConflict

_INSERT_OUTBOX = insert(t.outbox)
# Read by every controller every cycle: built once.
_STAMP = select(
    select(func.coalesce(func.sum(t.exclusions.c.version), 0)).scalar_subquery(),
    select(func.coalesce(func.max(t.pool_scores.c.generation), 0)).scalar_subquery(),
    select(
        func.coalesce(func.sum(t.pools.c.up_since), 0.0) + func.count(t.pools.c.up_since)
    ).scalar_subquery(),
    select(
        func.count() * 1_000_003
        + func.coalesce(func.sum(func.length(t.partition_intents.c.partition)), 0)
    ).scalar_subquery(),
)
_RECLAIMS = (
    select(t.instance_history.c.pool, t.instance_history.c.instance_id, t.instance_history.c.at)
    .where(
        t.instance_history.c.at >= bindparam("since"),
        t.instance_history.c.trigger.in_(("reclaim_notice", "server_vanished")),
    )
    .order_by(t.instance_history.c.at)
)


class SqlSignals:
    """The signals' and intents' roles of fleet state (`SignalStore`, `IntentStore`),
    on the fleet-state database's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------ signals

    def exclusions(self) -> dict[PoolId, Exclusion]:
        with self.engine.connect() as conn:
            return {r.pool: rows.exclusion_of(r) for r in conn.execute(select(t.exclusions))}

    def put_exclusion(self, exclusion: Exclusion, event: LifecycleEvent) -> Exclusion:
        row = rows.exclusion_row(exclusion)
        row["version"] = exclusion.version + 1
        with self.engine.begin() as conn:
            if exclusion.version == 0:
                try:
                    conn.execute(insert(t.exclusions).values(**row))
                except IntegrityError:
                    raise StateConflict(f"exclusion of {exclusion.pool} exists") from None
            else:
                done = conn.execute(
                    update(t.exclusions)
                    .where(
                        t.exclusions.c.pool == exclusion.pool,
                        t.exclusions.c.version == exclusion.version,
                    )
                    .values(**row)
                )
                if done.rowcount != 1:
                    raise StateConflict(f"exclusion of {exclusion.pool} moved")
            conn.execute(_INSERT_OUTBOX, [rows.outbox_row(event)])
        return rows.exclusion_of_row(row)

    def save_scores(self, scores: Sequence[PoolScore], keep: int = 288) -> int:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        with self.engine.begin() as conn:
            last = conn.execute(select(func.max(t.pool_scores.c.generation))).scalar()
            generation = int(last or 0) + 1
            if scores:
                conn.execute(
                    insert(t.pool_scores),
                    [
                        {
                            "generation": generation,
                            "pool": sc.pool,
                            "computed_at": sc.computed_at,
                            "body": json.dumps(rows.score_body(sc)),
                        }
                        for sc in scores
                    ],
                )
            conn.execute(
                delete(t.pool_scores).where(t.pool_scores.c.generation <= generation - keep)
            )
        return generation

    def signal_stamp(self) -> tuple[int, int, float, int]:
        """What moves when an exclusion, a score generation, a pool's age or an intent
        is written: (sum of the exclusions' versions, latest score generation, a digest
        of the pools' ages, a digest of the intents). One cheap query; a reader reloads
        only what moved."""
        with self.engine.connect() as conn:
            row = conn.execute(_STAMP).one()
        return int(row[0]), int(row[1]), float(row[2]), int(row[3])

    def reclaims_since(self, since: float) -> list[tuple[PoolId, str, float]]:
        """(pool, instance, at) of every reclaim recorded at or after `since`: notices and
        servers that vanished without our delete, of every partition."""
        with self.engine.connect() as conn:
            rows = conn.execute(_RECLAIMS, {"since": since}).all()
        return [(r[0], r[1], float(r[2])) for r in rows]

    def pool_ages(self) -> dict[PoolId, float | None]:
        """Since when each pool has had capacity (None: it has none now)."""
        with self.engine.connect() as conn:
            return {
                r.id: r.up_since for r in conn.execute(select(t.pools.c.id, t.pools.c.up_since))
            }

    def set_pool_age(self, pool: PoolId, up_since: float | None) -> bool:
        """Record that `pool` has had capacity since `up_since` (None: it has none now),
        only if that changes whether it has any: replicas that see the same change
        write it once, and the first time stands. Returns whether it was written."""
        c = t.pools.c
        gate = c.up_since.is_(None) if up_since is not None else c.up_since.is_not(None)
        with self.engine.begin() as conn:
            done = conn.execute(update(t.pools).where(c.id == pool, gate).values(up_since=up_since))
        return bool(done.rowcount)

    def live_per_pool(self) -> dict[PoolId, int]:
        """Live instances (of every partition) per pool."""
        c = t.instances.c
        q = (
            select(c.pool, func.count())
            .where(c.state.in_([s.value for s in LIVE]))
            .group_by(c.pool)
        )
        with self.engine.connect() as conn:
            return {pool: int(n) for pool, n in conn.execute(q)}

    # ------------------------------------------------------------ intents

    def put_intent(self, partition: str, intent: str, at: float, by: str) -> None:
        """Record what an operator asks of a partition (one intent per partition)."""
        with self.engine.begin() as conn:
            conn.execute(
                delete(t.partition_intents).where(t.partition_intents.c.partition == partition)
            )
            conn.execute(
                insert(t.partition_intents).values(
                    partition=partition, intent=intent, requested_at=at, requested_by=by
                )
            )

    def drop_intent(self, partition: str) -> bool:
        with self.engine.begin() as conn:
            gone = conn.execute(
                delete(t.partition_intents).where(t.partition_intents.c.partition == partition)
            )
        return bool(gone.rowcount)

    def intents(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.partition_intents.c.partition, t.partition_intents.c.intent)
            )
            return {r.partition: r.intent for r in rows}

    def latest_scores(self) -> dict[PoolId, PoolScore]:
        with self.engine.connect() as conn:
            last = conn.execute(select(func.max(t.pool_scores.c.generation))).scalar()
            if last is None:
                return {}
            q = select(t.pool_scores).where(t.pool_scores.c.generation == last)
            return {r.pool: rows.score_of(r) for r in conn.execute(q)}
