"""Opening a state database, and bringing its schema to the newest revision once,
whoever starts first."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError

MIGRATIONS = Path(__file__).parent / "migrations"


def sqlite_url(path: Path | str) -> str:
    return f"sqlite:///{Path(path)}"


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # Processes starting together (replicas, `sco run` beside `sco watch`) would race
    # to create the same tables: one migrates while the others wait, then find
    # nothing to do.
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        elif engine.dialect.name == "sqlite":
            _sqlite_write_lock(conn)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _sqlite_write_lock(conn: Connection) -> None:
    """SQLite's write lock for this transaction, taken before its first statement (the
    driver would begin it only at the first insert, after the tables were made)."""
    _until_unlocked(lambda: conn.exec_driver_sql("BEGIN IMMEDIATE"))


def _until_unlocked(act: Callable[[], object]) -> None:
    """`act` tried again while another process holds the file's lock: past the busy
    timeout (a slow migration), or where SQLite answers busy without waiting (a new
    file turned to WAL by two processes at once)."""
    deadline = time.monotonic() + MIGRATION_WAIT_S
    while True:
        try:
            act()
            return
        except (OperationalError, sqlite3.OperationalError) as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


_MIGRATION_LOCK = 0x5C0_0001  # an advisory-lock key of sco's own
MIGRATION_WAIT_S = 120.0  # how long a process waits for another's migration


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=5000")
    # WAL lets readers run beside the writer; NORMAL keeps commits durable at checkpoints.
    _until_unlocked(lambda: cur.execute("PRAGMA journal_mode=WAL"))
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA mmap_size=268435456")  # readers map the file: the log is read hot
    cur.execute("PRAGMA cache_size=-65536")
    cur.close()


def open_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # A server database can fail over (Patroni): test a pooled connection before
    # use, so the first write after a failover goes to the new primary.
    return create_engine(url, pool_pre_ping=True)
