"""Independent runs side by side (sco.lab.sweep): the same results, in the same order,
in this process, on local worker processes, and on a real Dask cluster on loopback;
a cluster that cannot run the sweep is refused, named, with exit 2."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sco.apps.common import bundled
from sco.engine.gcpolicy import THRESHOLDS
from sco.lab.sweep import IN_PROCESS, SweepError, Workers, sweep
from sco_harness.dask_cluster import dask_cluster, die_always, die_once, gc_thresholds, square

WORKLOAD = bundled("workloads", "synthetic-2d.swf")


def _replay(*extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "replay", "--workload", str(WORKLOAD),
         "--pool-size", "16", "--days", "0.3", "--policies", "sco,spot-requeue,sco-no-notice",
         "--json", *extra],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for outcomes in out["policies"].values():
        outcomes.pop("wall_s")  # how long a run took: the one thing that may differ
    return out


def test_local_workers_give_the_results_of_one_in_the_order_of_the_tasks() -> None:
    tasks = list(range(7))
    seen: list[tuple[int, int]] = []
    one = list(sweep(square, tasks, IN_PROCESS))
    two = list(sweep(square, tasks, Workers(2), lambda d, t: seen.append((d, t))))
    assert one == two == [x * x for x in tasks]
    assert seen == [(d, 7) for d in range(1, 8)]


def test_every_worker_and_every_sco_process_collects_garbage_alike() -> None:
    assert set(sweep(gc_thresholds, [0, 1], Workers(2))) == {THRESHOLDS}
    probe = (
        "import gc; from click.testing import CliRunner; from sco.apps.cli import cli; "
        "CliRunner().invoke(cli, ['policies']); "
        "print(gc.get_threshold(), gc.get_freeze_count() > 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split("\n")[-2] == f"{THRESHOLDS} True", done.stdout


def test_no_worker_at_all_is_refused() -> None:
    with pytest.raises(SweepError, match="--workers: 0"):
        Workers(0)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_cluster_exits_2_naming_it() -> None:
    address = f"tcp://127.0.0.1:{_closed_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "replay", "--workload", str(WORKLOAD),
         "--days", "0.1", "--policies", "sco", "--cluster", address],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--cluster {address}: cannot reach a Dask scheduler" in done.stderr


def test_workers_default_to_sco_workers_when_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from sco.apps.cli import cli

    monkeypatch.setenv("SCO_WORKERS", "0")  # read, and refused as --workers 0 would be
    out = CliRunner().invoke(cli, ["replay", "--workload", str(WORKLOAD), "--days", "0.1"])
    assert out.exit_code == 2, out.output
    assert "Invalid value for '--workers': 0" in out.output, out.output


def test_a_replay_on_a_dask_cluster_is_the_replay_on_one_and_two_workers(
    tmp_path: Path,
) -> None:
    alone = _replay("--workers", "1")
    assert alone == _replay("--workers", "2")
    with dask_cluster(tmp_path / "dask") as address:
        assert _replay("--cluster", address) == alone


def test_a_worker_lost_mid_sweep_has_its_task_run_again_counted_once(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    tasks = [(str(marker) if x == 3 else "", x) for x in range(8)]
    with dask_cluster(tmp_path / "dask") as address:
        got = list(sweep(die_once, tasks, Workers(cluster=address)))
    assert marker.exists()  # a worker process did go down, with task 3 on it
    assert got == [x * x for x in range(8)]


def test_a_run_that_takes_down_every_worker_is_given_up_on_named(tmp_path: Path) -> None:
    with (
        dask_cluster(tmp_path / "dask") as address,
        pytest.raises(SweepError, match=r"run 1 of 1 lost \(KilledWorker"),
    ):
        list(sweep(die_always, [0], Workers(cluster=address)))


def test_workers_of_another_hash_seed_are_refused_before_any_run(tmp_path: Path) -> None:
    with (
        dask_cluster(tmp_path / "dask", workers=1, hash_seed="123") as address,
        pytest.raises(SweepError, match=r"PYTHONHASHSEED 123 \(here 6640\)"),
    ):
        list(sweep(square, [1, 2], Workers(cluster=address)))
