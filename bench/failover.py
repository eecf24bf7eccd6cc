"""Failover: the Patroni primary is lost under the controller's writes.

Starts etcd and a two-node Patroni cluster with synchronous replication,
runs a partition controller on a churning simulated region against it, kills
the primary's Patroni and PostgreSQL with SIGKILL, and checks the promoted
replica. Prints one JSON line: {"rpo_transitions_lost": 0, "write_outage_s": ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from sco_harness.failover import run_failover
from sco_harness.patroni import PatroniCluster
from sco_harness.services import stop_on_signals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--after-s", type=float, default=15.0, help="Writing after the failover.")
    args = ap.parse_args()
    cluster = PatroniCluster().start()
    try:
        with tempfile.TemporaryDirectory(prefix="sco-failover-") as tmp:
            result = run_failover(cluster, Path(tmp), after_s=args.after_s)
    finally:
        cluster.stop()
    print(
        f"[bench/failover] errors during the outage: {sorted(set(result.errors))}", file=sys.stderr
    )
    print(json.dumps(result.as_dict(), sort_keys=True))


if __name__ == "__main__":
    with stop_on_signals():
        main()
