"""Pool scorer over a large history in chDB.

Loads 1,000,000 lifecycle events for 200 pools into chDB through the history's
own `load` (in batches, before the clock starts: loading is not what is timed),
then times one scoring run: the history queries plus the empirical-Bayes
shrinkage. Prints one JSON object as its last line:
{"events": ..., "pools": ..., "load_seconds": ..., "seconds": ...}.

    .venv/bin/python bench/scorer.py [--events 1000000 | --smoke]

`--smoke` (20,000 events, a few seconds) checks that the bench runs; its time
says nothing about the scorer at scale.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections.abc import Iterator, Sequence

from sco.adapters.clickhouse.history import ClickHouseHistory
from sco.decide.scorer import ScorerConfig, score_pools
from sco.domain.events import LifecycleEvent
from sco_harness.builders import many_spot_pools
from sco_harness.services import stop_on_signals

POOLS = 200
SMOKE_EVENTS = 20_000
BATCH = 50_000  # events per insert: bounded memory, few round trips
_KINDS = ("recorded", "create_accepted", "server_active", "node_joined")
_FROM = (None, "requested", "creating", "active", "ready")
_TO = ("requested", "creating", "active", "ready")


def events(instances: int, pools: Sequence[str]) -> Iterator[LifecycleEvent]:
    """Each instance: requested, accepted, active, ready, then (one in four)
    reclaimed, else drained; five events, a minute apart. Instance k lives in pool
    k % len(pools), and a new one starts every 3 s."""
    for i in range(instances):
        pool, reclaimed = pools[i % len(pools)], i % 4 == 0
        for s in range(5):
            kind = _KINDS[s] if s < 4 else ("server_vanished" if reclaimed else "drain_requested")
            to = _TO[s] if s < 4 else ("gone" if reclaimed else "draining")
            yield LifecycleEvent(
                f"{i}:{s}", i * 3.0 + s * 60.0, "bench", pool, str(i), kind, "", _FROM[s], to
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--events", type=int, default=1_000_000)
    size.add_argument("--smoke", action="store_true", help=f"{SMOKE_EVENTS} events")
    args = ap.parse_args()
    wanted = SMOKE_EVENTS if args.smoke else args.events
    pools = {p.id: p for p in many_spot_pools(POOLS)}
    ids = sorted(pools)
    instances = wanted // 5
    with tempfile.TemporaryDirectory() as tmp:
        # Not held: the timed run opens chDB as a one-shot `sco score` does.
        history = ClickHouseHistory(f"chdb://{tmp}/history")
        try:
            loading = time.perf_counter()
            stream = events(instances, ids)
            while batch := list(itertools.islice(stream, BATCH)):
                history.load(batch)
            load_seconds = time.perf_counter() - loading
            total = history.count()
            now = instances * 3.0 + 600
            cfg = ScorerConfig(window_s=now + 1)
            start = time.perf_counter()
            stats = history.pool_stats(now, cfg.window_s)
            scores = score_pools(stats, pools, now, cfg)
            seconds = time.perf_counter() - start
        finally:
            history.close()
    timed = {"load_seconds": round(load_seconds, 3), "seconds": round(seconds, 3)}
    print(json.dumps({"events": total, "pools": len(scores), **timed}))


if __name__ == "__main__":
    with stop_on_signals():
        main()
