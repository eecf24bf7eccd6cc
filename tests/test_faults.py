"""The fault matrix's short tier: three of its faults, one per kind of dependency
(the cloud's API, the event pipeline, the fleet state), on the real services.
bench/faults.py runs the whole matrix with longer outages."""

from __future__ import annotations

from pathlib import Path

from sco.testing.faults import LOSSES, total
from sco.testing.faults.controlplane import run


def test_short_fault_tier_loses_nothing_and_recovers(tmp_path: Path) -> None:
    results = run(tmp_path, short=True, base_port=19160, only=["5xx", "kafka", "unreachable"])
    assert [r.fault for r in results] == [
        "nova_5xx_storm",
        "kafka_down_15s",
        "database_unreachable_10s",
    ]
    summary = total(results)
    rows = [r.as_dict() for r in results]
    for loss in LOSSES:
        assert summary[loss] == 0, rows
    assert summary["max_recovery_s"] <= 60, rows
