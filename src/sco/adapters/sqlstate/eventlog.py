"""The embedded event log: a durable, append-only table in the state database.

Offsets are the table's autoincrement key; each consumer's committed offset is
a row of its own. A reader starts at the committed offset and then moves on
as it reads, as a Kafka consumer does; a restarted one starts over from the
commit.

The log may share the state database (one process, as in a simulation: the
relay is then one transaction) or have a SQLite file of its own
(`SqlEventLog.open`): SQLite has one writer per file, and a log taking
appends at full rate would otherwise keep the controllers and the watcher
waiting to write state. Appends skip event ids already in the log, so a relay that
crashed after appending and before clearing its outbox appends nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from sco.adapters.sqlstate import schema as t
from sco.adapters.sqlstate.engine import migrate, open_engine
from sco.domain.events import LifecycleEvent
from sco.ports import LogRecord


class SqlEventLog:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._positions: dict[str, int] = {}  # where this process's readers are
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

    @classmethod
    def open(cls, url: str) -> SqlEventLog:
        """A log in its own database (schema by the same migrations as fleet state)."""
        engine = open_engine(url)
        migrate(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

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

    def absorb_outbox(self, source: Engine | None = None) -> int:
        """Relay the outbox of `source` (default: this log's database); returns how
        many events were relayed (sharing a database: how many were new to the log).

        Sharing a database, the at-least-once relay of `sco.engine.outbox` is one
        INSERT ... SELECT and one DELETE in one transaction. Across databases it is
        copy, then clear: a crash between the two copies again, and the log skips
        event ids it has.
        """
        if source is not None and source is not self.engine:
            return self._absorb_from(source)
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

    def _absorb_from(self, source: Engine) -> int:
        with source.connect() as conn:
            rows = conn.execute(
                select(
                    t.outbox.c.id, t.outbox.c.event_id, t.outbox.c.pool, t.outbox.c.payload
                ).order_by(t.outbox.c.id)
            ).all()
        if not rows:
            return 0
        self.append_raw([(r.event_id, r.pool, r.payload) for r in rows])
        with source.begin() as conn:
            conn.execute(delete(t.outbox).where(t.outbox.c.id <= rows[-1].id))
        return len(rows)

    def committed(self, consumer: str) -> int:
        q = select(t.consumer_offsets.c.offset).where(t.consumer_offsets.c.consumer == consumer)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

    def read(self, consumer: str, limit: int) -> list[LogRecord]:
        after = self._positions.get(consumer)
        if after is None:
            after = self._positions[consumer] = self.committed(consumer)
        with self.engine.connect() as conn:
            cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cur.execute(self._sql["read"], (after, limit))
                records = list(map(LogRecord._make, cur.fetchall()))
            finally:
                cur.close()
        if records:
            self._positions[consumer] = records[-1].offset
        return records

    def commit(self, consumer: str, offset: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(self._commit, {"consumer": consumer, "offset": offset})

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
