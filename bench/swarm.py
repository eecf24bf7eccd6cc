"""The swarm, long form (issue 25): thousands of seeded worlds of the whole control plane
under faults, then each seam's fix reverted in turn to show the swarm finds it.

1. `sco lab swarm --seeds N` over seeds 0..N-1 on every CPU: every invariant must
   hold in every world.
2. For each patch in bench/mutants (each reverts the fix of one defect of issue 25),
   a copy of `src/` with the patch applied runs the swarm from seed 0 until its first
   violation, at most `--mutant-budget` seeds: the seeds it took, and what broke.

Fleet state is the in-memory twin by default (`"state": "memory"`); `--state sqlite`
runs every world on SQLite instead (the SQL path): the twin and the database are held
to one conformance suite, and a seed gives the same checks on either.

Prints one JSON line: {"seeds", "state", "simulated_days", "faults_injected" (faults
scheduled), "faults_effective" and "faults_effective_by_kind" (times a fault changed
what happened), "invariant_violations", "invariants", "checks", "found_by_mutation":
{mutant: {"found", "seeds", "broke"}}, ...}.

    .venv/bin/python bench/swarm.py [--seeds 2000] [--mutant-budget 400] [--workers N]
    .venv/bin/python bench/swarm.py --state sqlite
    .venv/bin/python bench/swarm.py --smoke     # seconds: CI keeps it from rotting
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "bench" / "mutants"


def sco(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "lab", "swarm", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def swarm(seeds: int, workers: int | None, state: str) -> dict[str, object]:
    args = ["--seeds", str(seeds), "--json", "--no-shrink", "--state", state]
    if workers:
        args += ["--workers", str(workers)]
    done = sco(*args)
    if done.returncode not in (0, 1):
        raise SystemExit(f"sco lab swarm failed ({done.returncode}): {done.stderr[-2000:]}")
    line: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if done.returncode == 1:
        print(done.stderr, file=sys.stderr)  # the failing seeds and their replays
    return line


def mutant(patch: Path, budget: int, workers: int | None, state: str) -> dict[str, object]:
    """The swarm on a copy of src/ with `patch` applied, until its first violation."""
    with tempfile.TemporaryDirectory(prefix="sco-mutant-") as scratch:
        shutil.copytree(ROOT / "src", Path(scratch) / "src")
        applied = subprocess.run(
            ["git", "apply", str(patch)], cwd=scratch, capture_output=True, text=True, check=False
        )
        if applied.returncode != 0:
            return {"found": False, "error": f"does not apply: {applied.stderr.strip()}"}
        env = dict(os.environ, PYTHONPATH=str(Path(scratch) / "src"))
        args = ["--seeds", str(budget), "--json", "--no-shrink", "--stop-at-first"]
        args += ["--state", state]
        if workers:
            args += ["--workers", str(workers)]
        started = time.monotonic()
        done = sco(*args, env=env)
    if done.returncode not in (0, 1):
        return {"found": False, "error": done.stderr.strip()[-500:]}
    line = json.loads(done.stdout.strip().splitlines()[-1])
    broke = sorted(set(re.findall(r"^\s+(\w+) at \d+s:", done.stderr, re.M)))
    return {
        "found": done.returncode == 1,
        "seeds": line["seeds"],
        "first_failing_seed": (line["failing_seeds"] or [None])[0],
        "broke": broke,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--mutant-budget", type=int, default=400)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--mutants", default="", help="only these (name prefixes, comma)")
    parser.add_argument(
        "--state", choices=["memory", "sqlite"], default="memory", help="fleet state of each world"
    )
    parser.add_argument("--smoke", action="store_true", help="2 seeds; one mutant, 2 seeds")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.mutant_budget = 2, 2
        args.mutants = args.mutants or "6-"
    started = time.monotonic()
    line = swarm(args.seeds, args.workers, args.state)
    wanted = [m for m in args.mutants.split(",") if m]
    found: dict[str, object] = {}
    for patch in sorted(MUTANTS.glob("*.patch")):
        if wanted and not any(patch.stem.startswith(w) for w in wanted):
            continue
        found[patch.stem] = mutant(patch, args.mutant_budget, args.workers, args.state)
        print(f"{patch.stem}: {found[patch.stem]}", file=sys.stderr)
    line["found_by_mutation"] = found
    line["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
