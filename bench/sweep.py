"""Independent runs side by side (issue 42): one sweep on 1 local worker, on N, and
on a local Dask cluster, timed, with whether their JSON is the same.

The sweep is `sco evaluate --suite spothedge` (every policy over seeded windows of
the three AWS traces: many runs of similar length) unless `--command` names
another `sco` command line; each is run as a user would, a fresh `sco` process.
Prints one JSON line: {"command", "workers", "one_worker_s", "n_workers_s",
"speedup", "same_json", "cluster_s", "same_json_on_cluster"}.

    .venv/bin/python bench/sweep.py [--windows 10] [--workers 2] [--cluster]
    .venv/bin/python bench/sweep.py --smoke     # seconds: CI keeps it from rotting
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sco_harness.dask_cluster import dask_cluster
from sco_harness.services import stop_on_signals


def log(msg: str) -> None:
    print(f"[bench/sweep] {msg}", file=sys.stderr, flush=True)


def run(command: list[str], *where: str) -> tuple[float, dict[str, Any]]:
    """Wall seconds of `sco COMMAND --json WHERE...`, and its JSON line less timings."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *command, "--json", *where],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"sco {shlex.join(command)} {' '.join(where)}: {done.stderr[-2000:]}")
    return took, _untimed(json.loads(done.stdout.strip().splitlines()[-1]))


def _untimed(value: Any) -> Any:
    """The JSON without what measures the machine rather than the runs."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--command", default=None, help="Another sweep: an `sco` command line.")
    ap.add_argument("--cluster", action="store_true", help="Also on a local Dask cluster.")
    ap.add_argument(
        "--smoke", action="store_true",
        help="1 window of two policies, and the Dask cluster: the machinery, not the speed",
    )  # fmt: skip
    args = ap.parse_args()
    command = shlex.split(args.command) if args.command else [
        "evaluate", "--suite", "spothedge", "--windows", str(args.windows),
    ]  # fmt: skip
    if args.smoke:
        command = ["evaluate", "--suite", "spothedge", "--windows", "1",
                   "--policies", "sco,spothedge"]  # fmt: skip
        args.cluster = True
    log(f"sco {shlex.join(command)}: 1 worker")
    one_s, one = run(command, "--workers", "1")
    log(f"{one_s:.1f} s; {args.workers} workers")
    n_s, many = run(command, "--workers", str(args.workers))
    out: dict[str, Any] = {
        "command": shlex.join(command),
        "workers": args.workers,
        "one_worker_s": round(one_s, 2),
        "n_workers_s": round(n_s, 2),
        "speedup": round(one_s / n_s, 3),
        "same_json": one == many,
        "cluster_s": None,
        "same_json_on_cluster": None,
    }
    if args.cluster:
        with (
            tempfile.TemporaryDirectory(prefix="sco-bench-sweep-") as tmp,
            dask_cluster(Path(tmp), workers=args.workers) as address,
        ):
            log(f"{n_s:.1f} s; on the Dask cluster at {address}")
            out["cluster_s"], on_cluster = run(command, "--cluster", address)
        out["cluster_s"] = round(out["cluster_s"], 2)
        out["same_json_on_cluster"] = one == on_cluster
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    with stop_on_signals():
        main()
