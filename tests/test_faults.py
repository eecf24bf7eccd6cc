"""The fault matrix's short tier: three of its faults, one per kind of dependency
(the cloud's API, the event pipeline, the fleet state), on the real services,
through bench/faults.py itself (which runs the whole matrix with longer outages),
so that the bench runs here too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sco_harness.faults import LOSSES

ROOT = Path(__file__).resolve().parents[1]


def test_short_fault_tier_loses_nothing_and_recovers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "faults.py"), "--short", "--scenarios",
         "controlplane", "--faults", "5xx", "kafka", "unreachable", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    *rows, summary = lines
    assert [r["fault"] for r in rows] == [
        "nova_5xx_storm",
        "kafka_down_15s",
        "database_unreachable_10s",
    ]
    for loss in LOSSES:  # recovery times are the bench's to report: the machine's load
        assert summary[loss] == 0, rows
