"""The fault matrix: each fault injected under load on the real services, and what it cost.

Scenarios (each starts the services it needs and stops them):
- controlplane: the whole control plane on Patroni, a Kafka-protocol broker, chDB
  history and the Nova stack; Nova 5xx storm, Nova answering in 10 s, Placement
  down, the broker down for 60 s, chDB unavailable, 2 s of clock skew between
  replicas, the database unreachable for 30 s, the PostgreSQL primary lost
  (sco_harness.faults.controlplane says how each is measured);
- the scenarios in sco_harness.faults' other modules: slurmctld restarted, a
  distributor replica killed, OpenBao unreachable at credential refresh, a full
  disk under the embedded SQLite state (slurm, openbao and disk share one Nova
  test stack).

Prints one JSON line per fault, then the total:
{"faults", "lost_transitions", "lost_events", "duplicate_creates", "leaked_servers",
 "stalled_partitions", "max_recovery_s"} (targets: every loss 0, max_recovery_s <= 60).
`--short` runs the shorter outages the test suite's tier uses; `--scenarios` and
`--faults` (substrings of the control plane's fault names) pick some.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

from sco_harness.faults import FaultResult, total
from sco_harness.faults.watch import HALLS, SLOTS
from sco_harness.openstack_stack import NovaStack
from sco_harness.services import stop_on_signals

SCENARIOS = ("controlplane", "slurm", "distributor", "openbao", "disk")
SHARED_PORT = 19740  # the Nova stack slurm, openbao and disk share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="shorter outages (the test tier)")
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    ap.add_argument("--faults", nargs="*", default=[], help="control-plane faults (substrings)")
    ap.add_argument("--workdir", type=Path, help="keep every service's files and logs here")
    args = ap.parse_args()
    results: list[FaultResult] = []
    with contextlib.ExitStack() as shared:
        stack: NovaStack | None = None  # one Nova test stack for the scenarios that take one
        for name in args.scenarios:
            module = importlib.import_module(f"sco_harness.faults.{name}")
            kwargs: dict[str, Any] = {}
            if name == "controlplane" and args.faults:
                kwargs["only"] = args.faults
            if "stack" in inspect.signature(module.run).parameters:
                if stack is None:
                    tmp = Path(shared.enter_context(tempfile.TemporaryDirectory()))
                    stack = NovaStack(tmp / "nova", SHARED_PORT, HALLS, SLOTS).up()
                    shared.callback(stack.down)
                kwargs["stack"] = stack
            with tempfile.TemporaryDirectory(prefix=f"sco-faults-{name}-") as tmp:
                folder = args.workdir / name if args.workdir else Path(tmp)
                folder.mkdir(parents=True, exist_ok=True)
                for result in module.run(folder, short=args.short, **kwargs):
                    results.append(result)
                    print(json.dumps(result.as_dict(), sort_keys=True), flush=True)
    print(json.dumps(total(results), sort_keys=True))


if __name__ == "__main__":
    with stop_on_signals():
        main()
