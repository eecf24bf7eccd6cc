"""The command line: results on success, one clear line and exit 2 on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sco.adapters.sqlstate.engine import sqlite_url
from sco.apps.common import bundled, parse_duration
from sco.lab.traces import load_traces
from sco_harness.builders import pool_score, write_json_trace, write_yaml

V100_4NODE = bundled("traces", "apache", "v100-4node")


def sco(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def test_simulate_json_ends_with_the_numbers(tmp_path: Path) -> None:
    out = sco("simulate", "--traces", V100_4NODE, "--duration", "12h", "--json")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("availability", "floor_availability", "cost_vs_guaranteed"):
        assert isinstance(last[key], float)
        assert 0.0 <= last[key] <= 1.5
    assert isinstance(last["reclaims"], int)
    assert last["creates"] >= 3
    assert last["simulated_hours"] == pytest.approx(12.0)


def test_simulate_on_sqlite_all_along_gives_what_the_twins_give(tmp_path: Path) -> None:
    """`--fleet-state sqlite` runs the SQL path from the first cycle (its file kept with
    --state); the twins, the default, are held to the same suite: the same numbers."""
    state = tmp_path / "sql.db"
    runs = {}
    for how, extra in (("memory", ()), ("sqlite", ("--state", state))):
        out = sco(
            "simulate", "--traces", V100_4NODE, "--duration", "1d", "--json",
            "--fleet-state", how, *extra,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        last = json.loads(out.stdout.strip().splitlines()[-1])
        last.pop("wall_s")
        runs[how] = last
    assert runs["memory"] == runs["sqlite"]
    assert runs["memory"]["creates"] >= 3
    assert state.stat().st_size > 0


def test_simulate_report_and_state(tmp_path: Path) -> None:
    report, state = tmp_path / "rep", tmp_path / "state.db"
    out = sco(
        "simulate", "--traces", V100_4NODE, "--duration", "6h", "--report", report, "--state", state
    )
    assert out.returncode == 0, out.stderr
    assert f"report: {report / 'index.html'}" in out.stdout
    html = (report / "index.html").read_text()
    assert "data:image/png;base64," in html
    summary = json.loads((report / "summary.json").read_text())
    assert summary["partitions"]["service"]["creates"] >= 3
    assert state.exists()


def test_pools_ranks_what_a_run_scored(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    history = f"chdb://{tmp_path / 'history'}"
    out = sco(
        "simulate", "--traces", V100_4NODE, "--duration", "1d", "--state", state,
        "--history", history,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "pool scoring runs: " in out.stdout
    assert f"events in {history}" in out.stdout
    listed = sco("pools", "--state", state, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    values = [r["score"]["value"] for r in rows]
    assert values == sorted(values, reverse=True)
    assert len(rows) == len(load_traces(V100_4NODE).series)  # each spot pool, ranked
    assert all(r["score"]["why"].startswith("hazard ") for r in rows)
    table = sco("pools", "--state", state)
    assert table.returncode == 0, table.stderr
    assert rows[0]["pool"] in table.stdout
    assert "survival" in table.stdout


def test_pools_reads_the_state_its_config_names(tmp_path: Path) -> None:
    """`sco pools` takes `--config` (and $SCO_CONFIG) as every other command does,
    and reads `state.url` from it; `--state` still wins over the file."""
    from sco.adapters.sqlstate.store import SqlFleetStore

    (tmp_path / "fleet").mkdir()
    store = SqlFleetStore(sqlite_url(tmp_path / "fleet" / "state.db"))
    store.save_scores([pool_score("r1/h1/gpu", 0.5, survival=0.9), pool_score("r1/h2/gpu", 0.1)])
    store.close()
    # A relative URL in the file is the file's folder's: run from elsewhere.
    config = write_yaml(tmp_path / "fleet" / "sco.yaml", {"state": {"url": "sqlite:///state.db"}})
    listed = sco("pools", "--config", config, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [r["pool"] for r in json.loads(listed.stdout)] == ["r1/h1/gpu", "r1/h2/gpu"]
    from_env = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "pools", "--json"], capture_output=True,
        text=True, cwd=tmp_path, check=False, env={**os.environ, "SCO_CONFIG": str(config)},
    )  # fmt: skip
    assert from_env.returncode == 0, from_env.stderr
    assert from_env.stdout == listed.stdout
    elsewhere = write_yaml(tmp_path / "other.yaml", {"state": {"url": "sqlite:///none.db"}})
    missing = sco("pools", "--config", elsewhere, cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"sco: error: state.url: {tmp_path / 'none.db'}: no such file"
    assert not (tmp_path / "none.db").exists(), "nothing created"
    over = sco("pools", "--config", elsewhere, "--state", tmp_path / "fleet" / "state.db")
    assert over.returncode == 0, over.stderr
    bad = write_yaml(tmp_path / "bad.yaml", {"state": {"link": "x"}})
    refused = sco("pools", "--config", bad)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith(f"sco: error: {bad}: state.link")


def test_evaluate_prints_the_table_and_json(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    write_json_trace(folder, "a", [4, 4, 0, 3, 4, 1, 4, 4] * 40, gap_s=300)
    write_json_trace(folder, "b", [2, 0, 4, 4, 4, 4, 0, 4] * 40, gap_s=300)
    out = sco(
        "evaluate", "--trace", folder, "--policies", "sco,spothedge,optimal",
        "--windows", "2", "--workers", "1", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # Only the JSON on stdout: HiGHS's banner (printed by its C++ when a solver is
    # made) went there and broke `--json | jq` until it was sent to stderr.
    (line,) = out.stdout.strip().splitlines()
    last = json.loads(line)
    assert set(last["traces"]["t"]) == {"sco", "spothedge", "optimal"}
    assert last["traces"]["t"]["optimal"]["availability"] == 1.0
    for m in last["traces"]["t"].values():
        assert 0.0 < m["cost_vs_guaranteed"] <= 1.5
    assert last["setting"]["windows"] == 2
    assert "spothedge" in out.stderr  # the table goes to stderr with --json


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "sco,clairvoyant"], "unknown policy 'clairvoyant'"),
        (["--windows", "0"], "windows must be >= 1"),
        ([], "a window needs"),  # 80 minutes of trace cannot hold a 24 h window
    ],
)
def test_evaluate_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    folder = tmp_path / "t"
    write_json_trace(folder, "a", [1] * 16, gap_s=300)
    out = sco("evaluate", "--trace", folder, *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_pools_on_bad_state(tmp_path: Path) -> None:
    missing = sco("pools", "--state", tmp_path / "none.db")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"sco: error: --state: {tmp_path / 'none.db'}: no such file"
    assert not (tmp_path / "none.db").exists()
    other = tmp_path / "other.db"
    other.write_bytes(b"")  # an empty file: SQLite, but not sco's
    out = sco("pools", "--state", other)
    assert out.returncode == 2
    assert out.stderr.startswith("sco: error: --state: cannot read fleet state")


def _no_output_files(tmp_path: Path, before: set[Path]) -> None:
    assert set(tmp_path.rglob("*")) == before, "bad input must write nothing"


def _bad(tmp_path: Path, *args: str | Path) -> str:
    before = set(tmp_path.rglob("*"))
    out = sco("simulate", *args, "--report", tmp_path / "rep", "--state", tmp_path / "s.db")
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("sco: error: ")
    _no_output_files(tmp_path, before)
    return lines[0]


def test_missing_trace_folder(tmp_path: Path) -> None:
    line = _bad(tmp_path, "--traces", tmp_path / "nope")
    assert str(tmp_path / "nope") in line
    assert "folder" in line


def test_malformed_trace(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "z.json").write_text('{"metadata": {}, "data": [1]}')
    line = _bad(tmp_path, "--traces", tmp_path / "t")
    assert "z.json" in line
    assert "metadata.gap_seconds" in line


def test_missing_demand_file(tmp_path: Path) -> None:
    line = _bad(tmp_path, "--traces", V100_4NODE, "--demand", tmp_path / "none.yaml")
    assert "none.yaml" in line


def test_floor_above_max(tmp_path: Path) -> None:
    demand = write_yaml(
        tmp_path / "d.yaml",
        {
            "partitions": [
                {"name": "p", "kind": "slurm", "target_units": 2, "floor_units": 9, "max_units": 4},
            ]
        },
    )
    line = _bad(tmp_path, "--traces", V100_4NODE, "--demand", demand)
    assert "d.yaml" in line
    assert "partitions[0].floor_units" in line


def test_negative_floor(tmp_path: Path) -> None:
    demand = write_yaml(
        tmp_path / "d.yaml",
        {
            "partitions": [
                {
                    "name": "p",
                    "kind": "slurm",
                    "target_units": 2,
                    "floor_units": -1,
                    "max_units": 4,
                },
            ]
        },
    )
    line = _bad(tmp_path, "--traces", V100_4NODE, "--demand", demand)
    assert "partitions[0].floor_units" in line


def test_unknown_policy(tmp_path: Path) -> None:
    line = _bad(tmp_path, "--traces", V100_4NODE, "--policy", "magic")
    assert "--policy" in line
    assert "magic" in line
    assert "sco" in line


@pytest.mark.parametrize("policy", ["round-robin", "even-spread"])
def test_run_refuses_a_policy_that_keeps_no_floor(tmp_path: Path, policy: str) -> None:
    """Regression (issue 25, item 7): `sco run` took the SkyServe baselines, which put
    nothing on guaranteed capacity when spot cannot hold the floor."""
    region = write_yaml(tmp_path / "r.yaml", {
        "region": "r", "image": "i",
        "pools": [{"hall": "h", "flavor": "f", "class": "spot", "price_per_h": 1}],
    })  # fmt: skip
    config = write_yaml(tmp_path / "sco.yaml", {
        "provider": {"cloud": "nowhere", "region_file": str(region)},
        "partitions": [{"name": "p", "kind": "slurm", "target_units": 2, "max_units": 4}],
    })  # fmt: skip
    checked = write_yaml(tmp_path / "p.yaml", {"policy": {"name": policy}})
    for args in (
        ["run", "--config", config, "--policy", policy, "--cycles", "1"],
        ["config", "check", checked],
    ):
        out = sco(*args)
        assert out.returncode == 2, (args, out.stderr)
        (line,) = out.stderr.strip().splitlines()
        assert "policy.name" in line
        assert f"{policy!r} keeps no floor" in line
        assert "one of all-guaranteed, cheapest, sco, spothedge" in line
    unknown = sco("run", "--config", config, "--policy", "magic", "--cycles", "1")
    assert unknown.returncode == 2, unknown.stderr  # was a traceback, exit 1
    assert "policy.name: unknown policy 'magic'" in unknown.stderr.strip()
    # Still a baseline to measure against.
    sim = sco("simulate", "--traces", V100_4NODE, "--duration", "1h", "--policy", policy,
              "--json", "--state", tmp_path / "s.db")  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout.strip().splitlines()[-1])["simulated_hours"] == pytest.approx(1.0)


def test_bad_duration_and_options(tmp_path: Path) -> None:
    assert "--duration" in _bad(tmp_path, "--traces", V100_4NODE, "--duration", "soon")
    assert "--pool-size" in _bad(tmp_path, "--traces", V100_4NODE, "--pool-size", "0")
    assert "--seed" in _bad(tmp_path, "--traces", V100_4NODE, "--seed", "x")
    assert "error_rate" in _bad(tmp_path, "--traces", V100_4NODE, "--error-rate", "2")


def test_start_past_the_end(tmp_path: Path) -> None:
    write_json_trace(tmp_path / "t", "a", [1, 1], gap_s=60)
    assert "--start-offset" in _bad(tmp_path, "--traces", tmp_path / "t", "--start-offset", "1h")


def test_policies_listed() -> None:
    out = sco("policies")
    assert out.returncode == 0
    assert out.stdout.split() == [
        "all-guaranteed",
        "cheapest",
        "even-spread",
        "round-robin",
        "sco",
        "spothedge",
    ]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("12h", 43200), ("1.5d", 129600)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--duration") == seconds


def test_run_help_lists_every_option() -> None:
    """Each parameter of `sco run` has its option (a missing one fails only at run time)."""
    from click.testing import CliRunner

    from sco.apps.cli import cli

    out = CliRunner().invoke(cli, ["run", "--help"]).output
    for option in (
        "--cloud",
        "--region",
        "--demand",
        "--state",
        "--policy",
        "--interval",
        "--cycles",
        "--replica",
        "--lease-ttl",
        "--metrics-port",
        "--dry-run",
    ):
        assert option in out
    import click

    run = cli.get_command(click.Context(cli), "run")
    assert run is not None
    assert run.callback is not None
    params = {p.name for p in run.params}
    import inspect

    assert params == set(inspect.signature(run.callback).parameters)


def test_simulate_a_fleet_scenario() -> None:
    out = sco("simulate", "--fleet", "v100-16node-x100", "--duration", "30m", "--json")
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(last["partitions"]) == {"batch-a", "batch-b", "web", "api"}
    assert 0.0 < last["served_fraction"] <= 1.0
    assert last["creates"] > 1000, "thousands of instances: each trace unit is 100"
    both = sco("simulate", "--fleet", "v100-16node-x100", "--traces", "x")
    assert both.returncode == 2
    assert "give one of --traces and --fleet" in both.stderr


def test_evaluate_at_fleet_scale_with_any_trace_and_demand(tmp_path: Path) -> None:
    """`--trace DIR --demand FILE --pool-size N`: whole simulations per policy and
    window, and the LP bound as `optimal`, in the paper suite's JSON shape."""
    demand = write_yaml(
        tmp_path / "demand.yaml",
        {
            "partitions": [
                {
                    "name": "batch",
                    "kind": "slurm",
                    "target_units": {"daily": {"00:00": 10, "07:00": 20, "19:00": 10}},
                    "floor_units": 5,
                    "max_units": 24,
                    "guaranteed_budget_units": 20,
                },
                {
                    "name": "web",
                    "kind": "kubernetes",
                    "target_units": 20,
                    "floor_units": 12,
                    "max_units": 24,
                    "guaranteed_budget_units": 20,
                },
            ]
        },
    )
    out = sco(
        "evaluate", "--trace", V100_4NODE, "--demand", demand, "--pool-size", "10",
        "--guaranteed-quota", "50", "--policies", "optimal,sco,spothedge,all-guaranteed",
        "--windows", "1", "--workers", "1", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.strip().splitlines()
    last = json.loads(line)
    assert last["setting"]["scale"] == "fleet"
    assert last["setting"]["scenarios"]["v100-4node"]["pool_size"] == 10
    runs = last["traces"]["v100-4node"]
    assert set(runs) == {"optimal", "sco", "spothedge", "all-guaranteed"}
    for m in runs.values():
        assert set(m) >= {"served_fraction", "floor_availability", "availability"}
        assert 0.0 < m["cost_vs_guaranteed"] <= 1.05
    assert runs["optimal"]["served_fraction"] == 1.0
    # The bound serves everything at no more than all-guaranteed, which serves it too.
    assert runs["all-guaranteed"]["served_fraction"] > 0.99
    assert runs["optimal"]["cost_vs_guaranteed"] < runs["all-guaranteed"]["cost_vs_guaranteed"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool-size", "10"], "--pool-size and --guaranteed-quota go with --demand"),
        (["--demand", "DEMAND", "--pool-size", "0"], "--pool-size: must be >= 1"),
        (["--demand", "DEMAND", "--policies", "sco,psychic"], "unknown policy 'psychic'"),
        (["--demand", "NOFILE"], "not found"),
    ],
)
def test_evaluate_fleet_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    demand = write_yaml(
        tmp_path / "d.yaml",
        {"partitions": [{"name": "p", "kind": "kubernetes", "target_units": 2, "max_units": 4}]},
    )
    args = [
        str(demand) if a == "DEMAND" else str(tmp_path / "no.yaml") if a == "NOFILE" else a
        for a in args
    ]
    out = sco("evaluate", "--trace", V100_4NODE, *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_score_every_alone_scores_every_policy_score_every_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/configuration.md: `policy.score_every_s` is how often `sco score --every` and
    `sco history load --score-every` score when given no duration; without the option,
    one pass, which serves no port (`http.score_port` is the loop's)."""
    from click.testing import CliRunner

    from sco.apps import signals as commands
    from sco.apps.cli import cli
    from sco.assembly import signals as loops

    config = write_yaml(tmp_path / "sco.yaml", {"policy": {"score_every_s": 123},
                                                "http": {"score_port": 9999}})  # fmt: skip
    ran: list[tuple[str, float | None, int]] = []

    @contextmanager
    def serving(component: str, settings: object, port: int, verbose: int = 0) -> Iterator[None]:
        ran.append((component, None, port))
        yield

    def score(settings: object, every_s: float | None, process: Any, say: object) -> int:
        with process():
            ran[-1] = (ran[-1][0], every_s, ran[-1][2])
        return 0

    def load(settings: object, process: Any, say: object, every_s: float | None) -> None:
        score(settings, every_s, process, say)

    monkeypatch.setattr(commands, "process", serving)  # the loops themselves not run
    monkeypatch.setattr(loops, "score", score)
    monkeypatch.setattr(loops, "load_history", load)
    for args in (["score"], ["score", "--every"], ["score", "--every", "7m"],
                 ["score", "--every", "--port", "9998"], ["history", "load", "--score-every"],
                 ["history", "load"]):  # fmt: skip
        done = CliRunner().invoke(cli, [*args, "--config", str(config)])
        assert done.exit_code == 0, done.output
    assert ran == [
        ("score", None, 0),
        ("score", 123.0, 9999),
        ("score", 420.0, 9999),
        ("score", 123.0, 9998),
        ("history-load", 123.0, 9103),
        ("history-load", None, 9103),
    ]
    # One pass serves nothing: a port asked of it is refused, not ignored.
    refused = sco("score", "--config", config, "--port", "9102", cwd=tmp_path)
    assert refused.returncode == 2
    assert "--port" in refused.stderr
    assert "--every" in refused.stderr
    assert sco("score", "--config", config, "--every", "0s", cwd=tmp_path).returncode == 2


def test_every_command_is_found_by_its_name() -> None:
    import click

    from sco.apps.cli import COMMANDS, cli

    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        assert command.name == name
    assert cli.get_command(ctx, "no-such-command") is None


def test_the_node_agent_loads_neither_the_database_nor_the_cloud_nor_the_lab() -> None:
    """`sco agent` runs on every node: it starts in a tenth of a second, not a second."""
    probe = (
        "import sys; from click.testing import CliRunner; from sco.apps.cli import cli; "
        "out = CliRunner().invoke(cli, ['agent', '--help']); assert out.exit_code == 0; "
        "import sco.agent, sco.apps.logs; "  # what it imports once it runs
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'sqlalchemy', 'alembic', 'openstack', 'pydantic', 'numpy', 'chdb'}), "
        "sorted(m for m in sys.modules if m.startswith(('sco.lab', 'sco.adapters'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[] []", done.stdout
