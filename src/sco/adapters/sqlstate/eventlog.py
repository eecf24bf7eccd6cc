"""The embedded event log: a durable, append-only table in the state database.

Offsets are the table's autoincrement key; each consumer's committed offset is
a row of its own. Appends skip event ids already in the log, so a relay that
crashed after appending and before clearing its outbox appends nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from sco.adapters.sqlstate import schema as t
from sco.domain.events import LifecycleEvent
from sco.ports import LogRecord


class SqlEventLog:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._offsets: dict[str, int] = {}  # what this process committed: no re-read
        dialect = sqlite if engine.dialect.name == "sqlite" else postgresql
        mark = "?" if engine.dialect.name == "sqlite" else "%s"
        conflict = "ON CONFLICT (event_id) DO NOTHING"
        self._sql = {
            "append": f"INSERT INTO event_log (event_id, pool, payload) VALUES ({mark}, {mark}, "
            f"{mark}) {conflict}",
            "read": f'SELECT "offset", payload FROM event_log WHERE "offset" > {mark} '
            f'ORDER BY "offset" LIMIT {mark}',
        }
        self._commit = dialect.insert(t.consumer_offsets).on_conflict_do_update(
            index_elements=["consumer"],
            set_={"offset": dialect.insert(t.consumer_offsets).excluded.offset},
        )

    def append(self, events: Sequence[LifecycleEvent]) -> None:
        self.append_raw([(e.event_id, e.pool, e.dumps()) for e in events])

    def append_raw(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Append (event_id, pool, payload) as given: tests and benchmarks use it to
        put what a broken producer would."""
        if not rows:
            return
        # The log's hot path: the driver's executemany, without per-row statement work.
        with self.engine.begin() as conn:
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cur.executemany(self._sql["append"], rows)
            finally:
                cur.close()

    def absorb_outbox(self) -> int:
        """Relay the outbox of the same database in one transaction; returns how many.

        The log and the outbox share a database here, so the at-least-once relay of
        `sco.runtime.outbox` can be one INSERT ... SELECT and one DELETE.
        """
        with self.engine.begin() as conn:
            last = conn.exec_driver_sql("SELECT max(id) FROM outbox").scalar()
            if last is None:
                return 0
            moved = conn.exec_driver_sql(
                "INSERT INTO event_log (event_id, pool, payload) SELECT event_id, pool, payload "
                f"FROM outbox WHERE id <= {int(last)} ORDER BY id ON CONFLICT (event_id) DO NOTHING"
            ).rowcount
            conn.exec_driver_sql(f"DELETE FROM outbox WHERE id <= {int(last)}")
            return int(moved or 0)

    def committed(self, consumer: str) -> int:
        if consumer in self._offsets:
            return self._offsets[consumer]
        q = select(t.consumer_offsets.c.offset).where(t.consumer_offsets.c.consumer == consumer)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        after = self.committed(consumer)
        with self.engine.connect() as conn:
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cur.execute(self._sql["read"], (after, limit))
                return [LogRecord(o, p) for o, p in cur.fetchall()]
            finally:
                cur.close()

    def commit(self, consumer: str, offset: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(self._commit, {"consumer": consumer, "offset": offset})
        self._offsets[consumer] = offset

    def dead_letter(self, consumer: str, record: LogRecord, error: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(t.dead_letters).values(
                    consumer=consumer, offset=record.offset, payload=record.payload, error=error
                )
            )

    def dead_letters(self) -> list[tuple[str, int, str, str]]:
        q = select(t.dead_letters).order_by(t.dead_letters.c.id)
        with self.engine.connect() as conn:
            return [(r.consumer, r.offset, r.payload, r.error) for r in conn.execute(q)]
