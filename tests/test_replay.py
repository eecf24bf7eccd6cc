"""`sco replay`: a batch workload through sco's own Slurm intake and node plane on the
simulated region, beside the clusters a user would otherwise run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sco.apps.cli import cli
from sco.apps.common import bundled
from sco.domain.lifecycle import Timeouts
from sco.lab.traces import load_traces, repeated
from sco.lab.workload.replay import ReplaySpec, fixed_size, replay
from sco.lab.workload.swf import BatchJob, Workload
from sco_harness.workloads import synthetic

TRACES = bundled("traces", "apache", "v100-9zone")


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("w") / "day.swf"
    path.write_text(synthetic(150, 1.0, 32))
    return path


def test_the_bundled_workload_is_the_generator_s() -> None:
    bundled_file = bundled("workloads", "synthetic-2d.swf")
    assert bundled_file.read_text() == synthetic(300, 2.0, 32)


def test_with_notice_sco_loses_no_work_that_spot_requeue_loses(day: Path) -> None:
    spec = ReplaySpec(day, TRACES, days=1, pool_size=16, notice_s=120.0)
    _, runs, about = replay(spec, ["sco", "spot-requeue", "power-save-guaranteed"])
    got = {r.policy: r.outcomes for r in runs}
    assert about["workload"]["jobs_kept"] == got["sco"]["jobs_submitted"]
    for name, o in got.items():
        assert o["jobs_failed"] == 0, name
        assert o["jobs_completed"] + o["jobs_unfinished"] == o["jobs_submitted"], name
    sco, spot, guaranteed = got["sco"], got["spot-requeue"], got["power-save-guaranteed"]
    assert sco["reclaims"] > 0, "the trace must take nodes back"
    assert sco["requeues"] > 0
    assert sco["lost_node_hours"] == 0.0
    assert spot["lost_node_hours"] > 0.0
    assert guaranteed["reclaims"] == 0
    assert guaranteed["lost_node_hours"] == 0.0
    assert sco["cost"] < guaranteed["cost"]
    for name, o in got.items():
        assert 0.0 < o["utilisation"] <= 1.0, name


def test_the_same_inputs_replay_the_same(day: Path) -> None:
    spec = ReplaySpec(day, TRACES, days=0.5, pool_size=16, notice_s=0.0)
    first = replay(spec, ["sco-no-notice"])[1][0].outcomes
    again = replay(spec, ["sco-no-notice"])[1][0].outcomes
    first.pop("wall_s")
    again.pop("wall_s")
    assert first == again
    assert first["lost_node_hours"] > 0, "without notice a reclaim takes work with it"


def test_a_static_cluster_is_sized_to_the_peak_or_the_mean() -> None:
    jobs = [BatchJob(1, 0.0, 4, 100.0, 100.0), BatchJob(2, 50.0, 2, 100.0, 100.0)]
    w = Workload(jobs, procs_per_node=1, max_nodes=5)
    assert fixed_size(w, 200.0, "peak") == 5  # 6 at once, capped by the cluster
    assert fixed_size(w, 200.0, "mean") == 3  # 600 node-seconds over 200 s


def test_the_command_prints_one_json_line_and_writes_a_report(day: Path, tmp_path: Path) -> None:
    args = ["replay", "--workload", str(day), "--days", "0.25", "--pool-size", "16"]
    args += ["--report", str(tmp_path / "report")]
    out = CliRunner().invoke(cli, [*args, "--policies", "sco,static-guaranteed", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output.strip().splitlines()[-1])
    assert set(doc["policies"]) == {"sco", "static-guaranteed"}
    keys = {"jobs_submitted", "jobs_completed", "jobs_failed", "wait_p50_s", "wait_p95_s"}
    keys |= {"wait_p99_s", "requeues", "lost_node_hours", "cost_vs_guaranteed"}
    keys |= {"utilisation", "wide_jobs_multi_pool", "wide_job_pools_mean", "jobs_met_reclaim"}
    assert keys <= set(doc["policies"]["sco"])
    assert doc["policies"]["static-guaranteed"]["fixed_nodes"] >= 1
    assert doc["window_days"] == 0.25
    assert doc["trace_plays"] == 1
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4  # the front, waits, queue, lost work
    assert "The front: work lost, wait (p95) and cost" in page
    assert "static-guaranteed" in page
    saved = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert saved["policies"] == doc["policies"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--policies", "sco,fastest"], "unknown fastest"),
        (["--days", "0"], "--days: must be > 0"),
        (["--max-nodes", "0"], "--max-nodes: must be >= 1"),
        (["--cycle-s", "0"], "--cycle-s: must be > 0, got 0.0"),
        (["--notice-s", "-1"], "--notice-s: must be >= 0"),
        (["--checkpoint-s", "0"], "--checkpoint-s: must be > 0"),
        (["--pool-size", "0"], "--pool-size: must be >= 1"),
        (["--requeue-lead-s", "-5"], "--requeue-lead-s: must be >= 0"),
        (["--cold-start-s", "-1"], "--cold-start-s: must be >= 0"),
    ],
)
def test_bad_input_exits_2_and_says_why(day: Path, extra: list[str], said: str) -> None:
    out = CliRunner().invoke(cli, ["replay", "--workload", str(day), *extra])
    assert out.exit_code == 2, out.output
    assert said in out.output


def test_a_missing_workload_exits_2(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["replay", "--workload", str(tmp_path / "none.swf")])
    assert out.exit_code == 2
    assert "none.swf" in out.output


def test_a_short_trace_repeats_from_its_start() -> None:
    traces = load_traces(bundled("traces", "apache", "v100-4node"))
    start, span = traces.start_s, traces.end_s - traces.start_s
    longer, plays = repeated(traces, start + 2.5 * span)
    assert plays == 3
    assert longer.start_s == start
    assert longer.end_s >= start + 2.5 * span
    for old, new in zip(traces.series, longer.series, strict=True):
        for x in (0.0, 0.37 * span, 0.99 * span):
            assert new.value_at(start + x) == old.value_at(start + x)
            assert new.value_at(start + span + x) == old.value_at(start + x)
            assert new.value_at(start + 2 * span + x) == old.value_at(start + x)
    assert repeated(traces, traces.end_s) == (traces, 1)


def test_timeouts_scale_with_a_replay_s_speedup(day: Path) -> None:
    """bench/slurm_replay.py replays a real run at 600x: its measured 3 s boots become
    1800 s of simulated cold start, as long as the default creating timeout, so every
    create expired and the simulation completed 1 job of 7. With the real controller's
    timeouts scaled as its time is, the cold start is waited for."""

    def outcomes(timeouts: Timeouts) -> dict[str, float | int | None]:
        spec = ReplaySpec(
            day, TRACES, days=0.25, pool_size=16, notice_s=0.0, cold_start_s=2000.0,
            timeouts=timeouts,
        )  # fmt: skip
        return replay(spec, ["sco"])[1][0].outcomes

    default, waited = outcomes(Timeouts()), outcomes(Timeouts().scaled(600.0))
    assert default["jobs_completed"] == 0, default
    assert waited["jobs_completed"] > 0, waited


def test_one_pool_keeps_every_job_of_many_nodes_in_one_pool(day: Path) -> None:
    args = ["replay", "--workload", str(day), "--days", "0.5", "--pool-size", "16", "--json"]
    out = CliRunner().invoke(cli, [*args, "--policies", "sco,spot-requeue", "--one-pool"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output.strip().splitlines()[-1])["policies"]
    assert doc["sco"]["wide_jobs_multi_pool"] == 0.0
    assert doc["sco"]["wide_job_pools_mean"] == 1.0
    assert doc["spot-requeue"]["wide_jobs_multi_pool"] > 0  # a baseline is not told
    assert doc["sco"]["jobs_failed"] == 0
