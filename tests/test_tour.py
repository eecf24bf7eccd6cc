"""The tour of docs/tour.md against the lab (`make lab`, a real Slurm controller, the
Kubernetes stand-in, the agents, sco's whole control plane), every command as written
and in order, each step's promise checked by `bench/tour.py` (issue 28: the README's
recipe failed as written, and nothing ran it).

It runs in a scratch copy of the repository (links, and a `.lab` of its own) on
free ports, so a lab a developer has up is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sco_harness.openstack_stack import echo

ROOT = Path(__file__).resolve().parents[1]
NOVA_BASE = os.environ.get("SCO_TEST_LAB_OS_BASE_PORT", "19600")


def test_the_tour_runs_as_written_and_leaves_nothing_behind() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tour.py")],
        env=dict(os.environ, SCO_OS_BASE_PORT=NOVA_BASE),
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    said = done.stderr[-4000:]
    assert done.returncode == 0, said
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["steps"] >= 10, line
    assert line["passed"] == line["steps"], said
    # Six sco processes, slurmctld, the Kubernetes stand-in and at least one agent.
    assert line["processes"] >= 9, line
    echo(f"tour: {line}")
