"""Fuzz every input sco reads (issue 17): sco.yaml, region and demand files, trace
folders, events from the stream, Nova and Placement answers, Slurm's JSON,
Kubernetes objects and the distributor's HTTP API.

Cases come from `sco_harness.fuzz` (hypothesis strategies: valid inputs mutated,
and noise); each is judged by running the code sco runs on such an input. For the
files a `sco` command reads, a sample also goes through the real `sco` in a
subprocess (`--commands`).

Progress goes to stderr; stdout gets one JSON line per input kind
({"kind", "cases", "accepted", "rejected", "command_cases", "crashes",
"unclear_errors", "wall_s"}) and a last line {"cases", "crashes", "unclear_errors"}.
Exit status 1 when anything was found; each finding is printed on stderr.

    .venv/bin/python bench/fuzz.py [--cases 50000] [--seed 17] [--commands 240]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import sys
import time
from typing import Any

import yaml

from sco.apps.distributor import DistributorConfig, create_app
from sco.assembly.settings import SettingsError, load, masked
from sco_harness.fuzz import AppHooks, Finding, Tally, draw_cases, run_commands, run_target
from sco_harness.fuzz.kinds import targets


def config_check(path: Any) -> str:
    """What `sco config check FILE` does with the file."""
    return yaml.safe_dump(masked(load(path)), sort_keys=False)


def app_hooks() -> AppHooks:
    return AppHooks(
        check_config=config_check,
        config_errors=(SettingsError,),
        distributor_app=lambda contracts: create_app(
            contracts, DistributorConfig(auth_failures_per_min=1e9, requests_per_s=1e9)
        ),
    )


def log(msg: str) -> None:
    print(f"[bench/fuzz] {msg}", file=sys.stderr, flush=True)


def _progress(t: Tally) -> None:
    log(
        f"{t.kind}: {t.cases} cases, {t.crashes} crashes, {t.unclear_errors} unclear "
        f"({t.wall_s:.0f} s)"
    )


def run(
    cases: int, seed: int, commands: int, kinds: list[str] | None = None, workers: int = 2
) -> list[Tally]:
    chosen = [t for t in targets(app_hooks()) if kinds is None or t.kind in kinds]
    weight = sum(t.weight for t in chosen)
    with_command = [t for t in chosen if t.command is not None]
    tallies = []
    for t in chosen:
        n = math.ceil(cases * t.weight / weight)
        log(f"{t.kind}: {n} cases")
        tally = run_target(t, n, seed, _progress)
        if t.command is not None and commands > 0:
            m = math.ceil(commands / len(with_command))
            log(f"{t.kind}: {m} cases through the sco command")
            sample = draw_cases(t, m, seed + 1)
            ran = run_commands(t, sample, workers, _progress)
            tally.cases += ran.cases
            tally.accepted += ran.accepted
            tally.rejected += ran.rejected
            tally.command_cases += ran.command_cases
            tally.findings += ran.findings
            tally.wall_s += ran.wall_s
        _progress(tally)
        print(json.dumps(tally.as_dict(), sort_keys=False), flush=True)
        tallies.append(tally)
    return tallies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=50_000, help="In-process cases in all.")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument(
        "--commands", type=int, default=240, help="Cases run through the real sco command, in all."
    )
    ap.add_argument("--kinds", default=None, help="Comma-separated input kinds (default all).")
    ap.add_argument("--workers", type=int, default=2, help="sco commands at once.")
    ap.add_argument("--memory-gb", type=int, default=8, help="Data memory the run may take.")
    ap.add_argument("--show", type=int, default=3, help="Findings shown per kind and error.")
    args = ap.parse_args(argv)
    # Parsers warn of what they reject, as designed: thousands of lines, none news.
    logging.getLogger("sco").setLevel(logging.ERROR)
    # A case that makes a parser allocate without bound fails as a MemoryError (a
    # crash, reported) rather than taking the machine's memory.
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (args.memory_gb * 2**30, hard))
    kinds = args.kinds.split(",") if args.kinds else None
    wall0 = time.monotonic()
    tallies = run(args.cases, args.seed, args.commands, kinds, args.workers)
    findings: list[Finding] = [f for t in tallies for f in t.findings]
    shown: dict[tuple[str, str, str], int] = {}
    for f in findings:
        key = (f.kind, f.what, f.error.split(":")[0] + f.where)
        shown[key] = shown.get(key, 0) + 1
        if shown[key] <= args.show:
            log(f"FOUND {json.dumps(f.as_dict())}")
    total = {
        "cases": sum(t.cases for t in tallies),
        "crashes": sum(t.crashes for t in tallies),
        "unclear_errors": sum(t.unclear_errors for t in tallies),
    }
    log(f"done in {time.monotonic() - wall0:.0f} s")
    print(json.dumps(total), flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
