"""The fault matrix: each fault injected under load on the real services, and what it cost.

Scenarios (each starts the services it needs and stops them):
- controlplane: the whole control plane on Patroni, a Kafka-protocol broker, chDB
  history and the Nova stack; Nova 5xx storm, Nova answering in 10 s, Placement
  down, the broker down for 60 s, chDB unavailable, 2 s of clock skew between
  replicas, the database unreachable for 30 s, the PostgreSQL primary lost
  (sco.testing.faults.controlplane says how each is measured);
- the scenarios in sco.testing.faults' other modules, where present: slurmctld
  restarted, a distributor replica killed, OpenBao unreachable at credential
  refresh, a full disk under the embedded SQLite state.

Prints one JSON line per fault, then the total:
{"faults", "lost_transitions", "lost_events", "duplicate_creates", "leaked_servers",
 "stalled_partitions", "max_recovery_s"} (targets: every loss 0, max_recovery_s <= 60).
`--short` runs the shorter outages the test suite's tier uses; `--scenarios` and
`--faults` (substrings of the control plane's fault names) pick some.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

from sco.testing.faults import FaultResult, total

SCENARIOS = ("controlplane", "slurm", "distributor", "openbao", "disk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="shorter outages (the test tier)")
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    ap.add_argument("--faults", nargs="*", default=[], help="control-plane faults (substrings)")
    ap.add_argument("--workdir", type=Path, help="keep every service's files and logs here")
    args = ap.parse_args()
    results: list[FaultResult] = []
    for name in args.scenarios:
        try:
            module = importlib.import_module(f"sco.testing.faults.{name}")
        except ModuleNotFoundError:
            print(f"[bench/faults] no scenario {name} in this checkout", file=sys.stderr)
            continue
        kwargs = {"only": args.faults} if name == "controlplane" and args.faults else {}
        with tempfile.TemporaryDirectory(prefix=f"sco-faults-{name}-") as tmp:
            folder = args.workdir / name if args.workdir else Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            for result in module.run(folder, short=args.short, **kwargs):
                results.append(result)
                print(json.dumps(result.as_dict(), sort_keys=True), flush=True)
    print(json.dumps(total(results), sort_keys=True))


if __name__ == "__main__":
    main()
