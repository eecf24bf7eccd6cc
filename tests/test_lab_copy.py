"""A lab run on the in-memory twins, its end state copied into SQLite, reads back as
the same run on SQLite does: `sco explain`, `sco pools`, the records and the history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.cli import cli
from sco.apps.common import bundled
from sco.apps.explain import explain
from sco.apps.pools import load_rows
from sco.lab.simulation import Simulation, SimulationSpec


def _spec(days: float) -> SimulationSpec:
    return SimulationSpec(
        traces=bundled("traces", "apache", "v100-9zone"),
        demand=bundled("demand", "demo.yaml"),
        duration_s=days * 86400,
        cycle_s=60.0,
        idle_resync_s=300.0,
    )


def _unversioned(row: dict[str, Any]) -> dict[str, Any]:
    """A pool row without the counters each store numbers on its own."""
    out = dict(row)
    if out["score"]:
        out["score"] = {k: v for k, v in out["score"].items() if k != "generation"}
    if out["exclusion"]:
        out["exclusion"] = {k: v for k, v in out["exclusion"].items() if k != "version"}
    return out


def test_a_copied_run_reads_back_as_the_run_on_sqlite(tmp_path: Path) -> None:
    on_sql, copied = sqlite_url(tmp_path / "sql.db"), sqlite_url(tmp_path / "copy.db")
    a = Simulation.build(_spec(1.5)).run(on_sql)
    b = Simulation.build(_spec(1.5)).run(copy_to=copied)
    assert a.outcome() == b.outcome()
    partitions = [p.name for p in Simulation.build(_spec(1.5)).demand.partitions()]
    for name in partitions:
        assert explain(copied, name, 0.0).as_dict() == explain(on_sql, name, 0.0).as_dict()
    assert [_unversioned(r.as_dict()) for r in load_rows(copied)] == [
        _unversioned(r.as_dict()) for r in load_rows(on_sql)
    ]
    stores = SqlFleetStore(on_sql), SqlFleetStore(copied)
    try:
        sql, copy = stores
        assert copy.history() == sql.history()
        assert len(copy.history()) > 100
        for name in partitions:
            assert copy.instances(name) == sql.instances(name)
        assert copy.counts() == sql.counts()
        assert copy.pool_ages() == sql.pool_ages()
        assert copy.outbox_size() == 0  # the run's events went to its own log
    finally:
        for s in stores:
            s.close()


def test_simulate_refuses_a_state_file_that_exists(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    state.write_text("not empty")
    traces = str(bundled("traces", "apache", "v100-9zone"))
    args = ["simulate", "--traces", traces, "--duration", "1h", "--state", str(state)]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 2
    assert "exists" in out.output


@pytest.mark.parametrize("days", [0.5])
def test_demo_state_file_serves_explain_and_pools(tmp_path: Path, days: float) -> None:
    folder = tmp_path / "demo"
    out = CliRunner().invoke(cli, ["demo", "--out", str(folder), "--days", str(days)])
    assert out.exit_code == 0, out.output
    state = folder / "state.db"
    shown = CliRunner().invoke(cli, ["explain", "--state", str(state), "slurm-batch"])
    assert shown.exit_code == 0, shown.output
    assert "slurm-batch" in shown.output
    ranked = CliRunner().invoke(cli, ["pools", "--state", str(state)])
    assert ranked.exit_code == 0, ranked.output
