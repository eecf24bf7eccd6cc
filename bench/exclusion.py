"""Exclusion watcher throughput and detection delay on the embedded event log.

A producer process (standing in for the controllers' outbox relays) pushes
lifecycle events for 200 pools through the embedded log (SQLite, WAL, a file of
its own as a multi-process deployment keeps it) as fast as the log takes them,
with threshold crossings mixed in; the watcher, in this process, consumes at
the same time and writes exclusions to the fleet-state database. events_per_s is events
over the time from the first append to the last event consumed. Detection
delay is from the commit of the batch holding a crossing event to the commit
of the exclusion it causes. Prints one JSON object as its last line:
{"events_per_s": ..., "detect_p99_s": ...}.

    .venv/bin/python bench/exclusion.py [--events 300000] [--batch 5000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from multiprocessing import Process, Queue
from pathlib import Path

from sco.adapters.sqlstate.engine import open_engine, sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.exclusion import ExclusionConfig
from sco.domain.events import LifecycleEvent
from sco.domain.pools import Pool
from sco.engine.watcher import ExclusionWatcher
from sco_harness.builders import many_spot_pools
from sco_harness.services import stop_on_signals

POOLS = 200


def pools() -> list[Pool]:
    return many_spot_pools(POOLS)


Batch = tuple[list[tuple[str, str, str]], list[str]]


def make_batches(rng: random.Random, ps: list[Pool], events: int, size: int) -> list[Batch]:
    """Batches of (event_id, pool, payload); about every other one ends with a pool's
    three reclaims in a row, which crosses the threshold."""
    doomed = rng.sample(range(POOLS), 150)
    out: list[Batch] = []
    n, sim_t = 0, 0.0
    while n < events:
        rows: list[tuple[str, str, str]] = []
        crossing = [ps[doomed.pop()].id] if doomed and rng.random() < 0.5 else []
        for k in range(size):
            sim_t += 0.001
            if crossing and k >= size - 3:
                pool, kind = crossing[0], "server_vanished"
            else:
                pool = ps[rng.randrange(POOLS)].id
                kind = "create_accepted" if rng.random() < 0.9 else "node_joined"
            e = LifecycleEvent(f"e{n}", sim_t, "bench", pool, f"i-{n}", kind, "bench")
            rows.append((e.event_id, e.pool, e.dumps()))
            n += 1
        out.append((rows, crossing))
    return out


def produce(log_db: str, batches: list[Batch], commits: Queue) -> None:  # type: ignore[type-arg]
    log = SqlEventLog(open_engine(log_db))
    for rows, crossing_pools in batches:
        log.append_raw(rows)
        committed = time.time()
        for pool in crossing_pools:
            commits.put((pool, committed))
    commits.put(("", time.time()))  # the producer is done
    log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=5_000)
    args = ap.parse_args()
    rng = random.Random(1)
    ps = pools()
    # Payloads are made before the clock starts: what is timed is the log and the watcher.
    batches = make_batches(rng, ps, args.events, args.batch)
    total = sum(len(rows) for rows, _ in batches)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlFleetStore(sqlite_url(Path(tmp) / "state.db"))
        log_db = sqlite_url(Path(tmp) / "events.db")
        log = SqlEventLog.open(log_db)
        persisted: dict[str, float] = {}
        # Short window and a cooldown longer than the run: each pool is excluded once.
        cfg = ExclusionConfig(window_s=60, max_reclaims=3, base_cooldown_s=1e9, max_cooldown_s=1e9)
        watcher = ExclusionWatcher(
            log, store, ps, cfg, on_change=lambda ex: persisted.setdefault(ex.pool, time.time())
        )
        commits: Queue = Queue()  # type: ignore[type-arg]
        producer = Process(target=produce, args=(log_db, batches, commits))
        start = time.time()
        producer.start()
        consumed = 0
        while consumed < total:
            got = watcher.poll(limit=args.batch).read
            consumed += got
            if not got:
                time.sleep(0.001)
        elapsed = time.time() - start
        producer.join()
        excluded = len(store.exclusions())
        store.close()
        log.close()
    delays = []
    produced_s = None
    while not commits.empty():
        pool, committed = commits.get()
        if not pool:
            produced_s = committed - start
        elif pool in persisted:
            delays.append(persisted[pool] - committed)
    delays.sort()
    p99 = delays[min(len(delays) - 1, int(0.99 * len(delays)))] if delays else None
    print(
        json.dumps(
            {
                "events": total,
                "pools": POOLS,
                "exclusions": excluded,
                "events_per_s": round(total / elapsed),
                "producer_events_per_s": round(total / produced_s) if produced_s else None,
                "detect_p50_s": round(statistics.median(delays), 4) if delays else None,
                "detect_p99_s": round(p99, 4) if p99 is not None else None,
            }
        )
    )


if __name__ == "__main__":
    with stop_on_signals():
        main()
