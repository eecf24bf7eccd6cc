"""Pool scorer over a large history in chDB.

Generates 1,000,000 lifecycle events for 200 pools inside chDB (with SQL, so
generation is not what is timed), then times one scoring run: the history
queries plus the empirical-Bayes shrinkage. Prints one JSON object as its last
line: {"events": ..., "seconds": ...}.

    .venv/bin/python bench/scorer.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from sco.adapters.clickhouse.history import ClickHouseHistory
from sco.decide.scorer import ScorerConfig, score_pools
from sco.testing.builders import many_spot_pools
from sco.testing.services import stop_on_signals

POOLS = 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    pools = {p.id: p for p in many_spot_pools(POOLS)}
    ids = sorted(pools)
    with tempfile.TemporaryDirectory() as tmp:
        history = ClickHouseHistory(f"chdb://{tmp}/history")
        # Each instance: requested, accepted, ready, then (one in four) reclaimed.
        # Five events per instance; instance k lives in pool k % 200.
        instances = args.events // 5
        pool_array = "[" + ",".join(f"'{p}'" for p in ids) + "]"
        history.client.command(
            f"""INSERT INTO {history.table}
            SELECT concat(toString(i), ':', toString(s)) AS event_id,
                   i * 3.0 + s * 60.0 AS at, 'bench',
                   arrayElement({pool_array}, (i % {POOLS}) + 1),
                   toString(i),
                   [ 'recorded', 'create_accepted', 'server_active', 'node_joined',
                     if(i % 4 = 0, 'server_vanished', 'drain_requested') ][s + 1],
                   [ '', 'requested', 'creating', 'active', 'ready' ][s + 1],
                   [ 'requested', 'creating', 'active', 'ready',
                     if(i % 4 = 0, 'gone', 'draining') ][s + 1],
                   NULL
            FROM (SELECT number AS i FROM numbers({instances})) ARRAY JOIN range(5) AS s"""
        )
        total = history.count()
        now = instances * 3.0 + 600
        cfg = ScorerConfig(window_s=now + 1)
        start = time.perf_counter()
        stats = history.pool_stats(now, cfg.window_s)
        scores = score_pools(stats, pools, now, cfg)
        seconds = time.perf_counter() - start
        history.close()
    print(json.dumps({"events": total, "pools": len(scores), "seconds": round(seconds, 3)}))


if __name__ == "__main__":
    with stop_on_signals():
        main()
