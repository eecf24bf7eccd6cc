"""What happened lately, from transitions (issue 28: after a reclaim `sco explain`
showed nothing new)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.explain import explain
from sco.apps.happened import happened
from sco.ports import HistoryRow
from sco_harness.builders import simulated_state


def row(i: str, at: float, frm: str | None, to: str, trigger: str | None, code: str) -> HistoryRow:
    return HistoryRow(i, "web", "r/h/spot", at, frm, to, trigger, code, code)


LIVES = [
    # i1: noticed, drained in time, deleted; its replacement i3 is ready 150 s later.
    row("i1", 100, "ready", "noticed", "reclaim_notice", "reclaim_notice"),
    row("i1", 110, "noticed", "draining", "drain_requested", "reclaim_notice"),
    row("i3", 110, None, "requested", None, "replace_reclaimed"),
    row("i1", 160, "draining", "terminating", "delete_sent", "node_drained"),
    row("i3", 260, "active", "ready", "node_joined", "node_joined"),
    # i2: gone without a word; its replacement i4 fails.
    row("i2", 300, "ready", "gone", "server_vanished", "server_vanished"),
    row("i4", 310, None, "requested", None, "replace_reclaimed"),
    row("i4", 320, "requested", "failed", "create_failed", "create_failed"),
    # i5: drained for being over target, still in its scheduler at the deadline.
    row("i5", 400, "ready", "draining", "drain_requested", "over_target"),
    row("i5", 460, "draining", "terminating", "delete_sent", "drain_deadline"),
    # Before the window: not counted.
    row("i0", 10, "ready", "gone", "server_vanished", "server_vanished"),
]


def test_a_partitions_hour_from_its_transitions() -> None:
    h = happened(LIVES, since=50)["web"]
    assert h.as_dict() == {
        "since": 50, "reclaims_noticed": 1, "reclaims_unannounced": 1, "creates": 2,
        "replacements": 2, "ready": 1, "drains": 2, "drained_in_time": 1,
        "drains_at_deadline": 1, "failed": 1, "ready_p50_s": 150.0, "ready_max_s": 150.0,
    }  # fmt: skip
    assert h.sentence() == (
        "1 reclaims with notice, 1 without; 2 creates (2 replacing reclaimed); 1 ready "
        "(request to ready p50 150 s, max 150 s); 2 drains: 1 left in time, 1 at the "
        "deadline; 1 failed"
    )


def test_a_noticed_server_that_then_vanishes_is_one_reclaim() -> None:
    rows = [
        row("i1", 100, "ready", "noticed", "reclaim_notice", "reclaim_notice"),
        row("i1", 220, "noticed", "gone", "server_vanished", "server_vanished"),
    ]
    h = happened(rows, since=0)["web"]
    assert (h.reclaims_noticed, h.reclaims_unannounced, h.reclaims) == (1, 0, 1)


def test_explain_says_what_happened_in_the_last_hour(tmp_path: Path) -> None:
    """After a simulated half day, `explain` an hour after its last reclaim counts
    that hour's transitions as the history holds them."""
    state = simulated_state(tmp_path / "state.sqlite")
    store = SqlFleetStore(sqlite_url(state))
    rows = store.history()
    last = max((r for r in rows if r.trigger == "server_vanished"), key=lambda r: r.at)
    end, partition = last.at + 1800, last.partition
    store.close()
    found = explain(sqlite_url(state), partition, end).as_dict()["last_hour"]
    recent = [r for r in rows if r.at >= end - 3600 and r.partition == partition]
    assert found["creates"] == sum(r.from_state is None for r in recent)
    assert found["ready"] == sum(r.trigger == "node_joined" for r in recent)
    vanished = sum(r.trigger == "server_vanished" for r in recent)
    assert found["reclaims_noticed"] + found["reclaims_unannounced"] >= vanished > 0
    every = explain(sqlite_url(state), partition, end + 3 * 86400).as_dict()["last_hour"]
    assert every["creates"] == every["reclaims_unannounced"] == 0  # nothing that late
    shown = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "explain", "--state", str(state), partition],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "last hour: 0 reclaims with notice, 0 without" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "explain", "--state", str(state), partition,
         "--json"], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(as_json.stdout)["last_hour"]["creates"] == 0
