"""Pool history: lifecycle events by pool and time, for the scorer.

The same client code talks to an embedded chDB (`chdb:///path`) and to a
ClickHouse server (`http://host:8123`). The table is a ReplacingMergeTree
keyed by (pool, at, event_id), read with FINAL, so loading an event twice
counts it once.

chDB is an engine inside the process that opens it, and one process at a
time may open a folder: processes take turns under an exclusive lock on
`<folder>.lock`. Each opening of the engine on a folder with tables costs about
1.3 MB that closing it does not give back (chDB 4.4), so a long-running process
holds the engine open (`hold`): it hands the folder over only when another
process asks for it (an exclusive lock on `<folder>.want`, taken while waiting),
between two of its calls, and opens it again at its next call. A one-shot
process (`hold=False`) opens and closes the engine for each call, about 40 ms.
On chDB, the scorer belongs in the loader's process (`sco history load
--score-every`): then nothing changes hands and memory stays flat. Several
histories in one process share a folder through separate databases. A
ClickHouse server keeps one client.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sco.decide.scorer import PoolStats
from sco.domain.events import RECLAIM_KINDS, LifecycleEvent

TABLE = "pool_events"
_COLUMNS = [
    "event_id",
    "at",
    "partition",
    "pool",
    "instance",
    "kind",
    "from_state",
    "to_state",
    "value",
]
_LEAVING = ("noticed", "draining", "terminating", "gone", "failed")
HANDOFF_EVERY_S = 0.2  # how often a holder looks for another process waiting

log = logging.getLogger(__name__)


class HistoryUnavailable(Exception):
    """Pool history cannot be reached (server down, credential refused, engine locked)."""


class ClickHouseHistory:
    def __init__(
        self,
        dsn: str,
        database: str = "sco",
        username: str | None = None,
        password: str | None = None,
        hold: bool = False,
    ) -> None:
        """`hold`: on chDB, keep the engine open between calls (a long-running
        process), handing the folder over when another process asks for it."""
        if not database.isidentifier():
            raise ValueError(f"database must be an identifier, got {database!r}")
        if dsn.startswith("chdb://") and not dsn.startswith("chdb:///"):
            # chdb://rel/path would name a host "rel": the folder is the working one's.
            dsn = f"chdb://{Path(dsn[len('chdb://') :]).resolve()}"
        self.dsn = dsn
        self.table = f"{database}.{TABLE}"
        self._auth: dict[str, Any] = {
            k: v for k, v in (("username", username), ("password", password)) if v
        }
        self._folder = dsn[len("chdb://") :] if dsn.startswith("chdb://") else None
        self._client: Any = None if self._folder is not None else self._connect()
        self.hold = hold and self._folder is not None
        self.opened = 0  # times this process opened the chDB engine
        self._engine: _Engine | None = None  # chDB open in this process, its lock held
        self._use = threading.Lock()
        self._stop = threading.Event()
        with self._session() as client:
            client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            client.command(self._ddl())
        if self.hold:
            threading.Thread(target=self._hand_over, name="chdb-handoff", daemon=True).start()

    def _connect(self) -> Any:
        import clickhouse_connect  # heavy and optional: only when history is used

        try:
            return clickhouse_connect.get_client(dsn=self.dsn, **self._auth)
        except Exception as e:
            raise HistoryUnavailable(f"{_safe(self.dsn)}: {type(e).__name__}: {e}") from None

    @contextmanager
    def _session(self) -> Iterator[Any]:
        """A client for one call: the server's, or chDB (opened under the folder's lock
        unless this process holds it already)."""
        if self._folder is None:
            yield self._client
            return
        with self._use:
            if self._engine is None:
                self._engine = self._open(self._folder)
            try:
                yield self._engine.client
            finally:
                if not self.hold:
                    self._shut()

    def _open(self, folder: str) -> _Engine:
        """Wait for the folder (saying so on `.want`, which a holder gives way to), then
        open chDB on it."""
        base = folder.rstrip("/")
        Path(base).parent.mkdir(parents=True, exist_ok=True)
        lock = open(f"{base}.lock", "a")  # noqa: SIM115 (held across calls: closed in _shut)
        try:
            with open(f"{base}.want", "a") as want:
                fcntl.flock(want, fcntl.LOCK_EX)
                fcntl.flock(lock, fcntl.LOCK_EX)
            client = self._connect()
        except BaseException:
            lock.close()
            raise
        self.opened += 1
        return _Engine(client, lock, f"{base}.want")

    def _shut(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.client.close()
            finally:
                engine.lock.close()  # closing the file releases its lock

    def _hand_over(self) -> None:
        """While holding chDB: between calls, close it if another process waits."""
        while not self._stop.wait(HANDOFF_EVERY_S):
            if not self._use.acquire(blocking=False):
                continue  # a call is under way
            try:
                if self._engine is not None and self._engine.wanted():
                    log.debug("chDB %s: handed over to another process", self._folder)
                    self._shut()
            finally:
                self._use.release()

    def _ddl(self) -> str:
        return f"""CREATE TABLE IF NOT EXISTS {self.table} (
                event_id String,
                at Float64,
                partition LowCardinality(String),
                pool LowCardinality(String),
                instance String,
                kind LowCardinality(String),
                from_state LowCardinality(String),
                to_state LowCardinality(String),
                value Nullable(Float64)
            ) ENGINE = ReplacingMergeTree ORDER BY (pool, at, event_id)"""

    def close(self) -> None:
        self._stop.set()
        with self._use:
            self._shut()
        if self._client is not None:
            self._client.close()

    def load(self, events: Sequence[LifecycleEvent]) -> int:
        if not events:
            return 0
        rows = [
            [
                e.event_id,
                e.at,
                e.partition,
                e.pool,
                e.instance or "",
                e.kind,
                e.from_state or "",
                e.to_state or "",
                e.value,
            ]
            for e in events
        ]
        with self._session() as client:
            client.insert(self.table, rows, column_names=_COLUMNS)
        return len(rows)

    def count(self) -> int:
        with self._session() as client:
            return int(client.command(f"SELECT count() FROM {self.table} FINAL"))

    def event_ids(self) -> set[str]:
        """Every event id held (benchmarks and audits)."""
        with self._session() as client:
            rows = client.query(f"SELECT DISTINCT event_id FROM {self.table}").result_rows
        return {str(r[0]) for r in rows}

    def pool_stats(self, now: float, window_s: float) -> list[PoolStats]:
        """Counts per pool over [now - window_s, now]; exposure clipped to the window."""
        with self._session() as client:
            return self._stats(client, now - window_s, now)

    def _stats(self, client: Any, lo: float, now: float) -> list[PoolStats]:
        params = {"lo": lo, "now": now}
        reclaim_kinds = ", ".join(f"'{k}'" for k in sorted(RECLAIM_KINDS))
        leaving = ", ".join(f"'{s}'" for s in _LEAVING)
        instances = client.query(
            f"""
            SELECT pool,
                   -- Only instances that were ready: greatest() skips a NULL ready_at
                   -- (ClickHouse 24.12 on), which counted a reclaimed instance that was
                   -- never ready as exposed from the window's start until it left.
                   sumIf(greatest(0, least(ifNull(left_at, {{now:Float64}}), {{now:Float64}})
                       - greatest(ready_at, {{lo:Float64}})), isNotNull(ready_at))
                       / 3600 AS exposure_h,
                   sum(reclaimed) AS reclaims,
                   quantileIf(0.5)(ready_at - born, isNotNull(born)
                       AND ready_at >= {{lo:Float64}}) AS ready_p50,
                   countIf(isNotNull(born) AND ready_at >= {{lo:Float64}}) AS ready_n
            FROM (
                SELECT pool, instance,
                       minIfOrNull(at, from_state = '') AS born,
                       minIfOrNull(at, to_state = 'ready') AS ready_at,
                       minIfOrNull(at, to_state IN ({leaving})) AS left_at,
                       max(kind IN ({reclaim_kinds}) AND at >= {{lo:Float64}}) AS reclaimed
                FROM {self.table} FINAL
                WHERE instance != '' AND at <= {{now:Float64}}
                GROUP BY pool, instance
            )
            WHERE isNotNull(ready_at) OR reclaimed
            GROUP BY pool
            """,
            parameters=params,
        ).result_rows
        events = client.query(
            f"""
            SELECT pool,
                   countIf(kind IN ('create_accepted', 'create_failed')) AS attempts,
                   countIf(kind = 'create_accepted') AS successes,
                   avgIf(value, kind = 'headroom') AS headroom,
                   countIf(kind = 'headroom') AS headroom_n
            FROM {self.table} FINAL
            WHERE at >= {{lo:Float64}} AND at <= {{now:Float64}}
            GROUP BY pool
            """,
            parameters=params,
        ).result_rows
        stats: dict[str, dict[str, Any]] = {}
        for pool, exposure_h, reclaims, p50, ready_n in instances:
            stats[pool] = {
                "exposure_h": float(exposure_h or 0.0),
                "reclaims": int(reclaims or 0),
                "ready_p50_s": float(p50) if ready_n else None,
                "ready_n": int(ready_n),
            }
        for pool, attempts, successes, headroom, headroom_n in events:
            stats.setdefault(pool, {}).update(
                attempts=int(attempts),
                successes=int(successes),
                headroom=float(headroom) if headroom_n else None,
                headroom_n=int(headroom_n),
            )
        return [PoolStats(pool, **fields) for pool, fields in sorted(stats.items())]


class _Engine:
    """chDB open in this process: its client, and the folder's lock (held while open)."""

    def __init__(self, client: Any, lock: IO[str], want: str) -> None:
        self.client = client
        self.lock = lock
        self.want = want

    def wanted(self) -> bool:
        """Whether another process is waiting for the folder (it holds `.want`)."""
        with open(self.want, "a") as want:
            try:
                fcntl.flock(want, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(want, fcntl.LOCK_UN)
            return False


def _safe(dsn: str) -> str:
    """A DSN without its password, for messages."""
    head, sep, rest = dsn.partition("://")
    auth, at, host = rest.partition("@")
    return f"{head}{sep}{auth.split(':', 1)[0]}@{host}" if at else dsn
