"""Scorer math against hand-computed cases, the loader and the scoring job, and chDB held
open. Pool history's own rules are in tests/conformance/test_history.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sco.adapters.clickhouse.history import ClickHouseHistory
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.scorer import PoolStats, ScorerConfig, beta_prior, gamma_prior, score_pools
from sco.domain.events import LifecycleEvent as E
from sco.engine.signals_jobs import HistoryLoader, ScoringJob, sample_headroom, score_now
from sco.lab.history import WindowedHistory
from sco_harness.builders import guaranteed_pool, spot_pool

A, B, C = spot_pool("hall-1", "a"), spot_pool("hall-2", "b"), spot_pool("hall-3", "c")
POOLS = {p.id: p for p in (A, B, C, guaranteed_pool())}
CFG = ScorerConfig(horizon_h=1.0)


def test_gamma_prior_by_moments() -> None:
    # Rates 0.6 and 0.0 per hour over 10 h each: mean 0.3, spread 0.09, Poisson noise
    # 0.3/10 = 0.03, so 0.06 between pools: beta = 0.3/0.06 = 5 h, alpha = 1.5.
    g = gamma_prior([PoolStats("a", 10.0, 6), PoolStats("b", 10.0, 0)], "peers", CFG)
    assert g.alpha == pytest.approx(1.5)
    assert g.beta_h == pytest.approx(5.0)


def test_homogeneous_peers_give_the_strongest_prior() -> None:
    g = gamma_prior([PoolStats("a", 10.0, 1), PoolStats("b", 10.0, 1)], "peers", CFG)
    assert g.beta_h == CFG.max_strength
    assert g.alpha == pytest.approx(0.1 * CFG.max_strength)


def test_beta_prior_by_moments() -> None:
    # 8/10 and 4/10: mean 0.6, spread 0.04, binomial noise 0.24/10 = 0.024, between
    # 0.016, strength 0.24/0.016 - 1 = 14.
    b = beta_prior(
        [PoolStats("a", attempts=10, successes=8), PoolStats("b", attempts=10, successes=4)],
        "peers",
        CFG,
    )
    assert b.mean == pytest.approx(0.6)
    assert b.strength == pytest.approx(14.0)


def test_scores_shrink_toward_peers_and_a_pool_with_no_history_gets_the_prior() -> None:
    stats = [
        PoolStats(A.id, exposure_h=10.0, reclaims=6, attempts=10, successes=8),
        PoolStats(B.id, exposure_h=10.0, reclaims=0, attempts=10, successes=4),
    ]
    scores = {s.pool: s for s in score_pools(stats, POOLS, 0.0, CFG)}
    assert set(scores) == {A.id, B.id, C.id}  # guaranteed pools are not scored
    a, c = scores[A.id], scores[C.id]
    assert a.hazard_per_h == pytest.approx((1.5 + 6) / (5 + 10))
    assert a.survival == pytest.approx((15 / 16) ** 7.5)
    assert a.success_ratio == pytest.approx((0.6 * 14 + 8) / (14 + 10))
    assert (c.exposure_h, c.reclaims, c.attempts) == (0.0, 0, 0)
    assert c.hazard_per_h == pytest.approx(0.3)
    assert c.survival == pytest.approx((5 / 6) ** 1.5)
    assert c.success_ratio == pytest.approx(0.6)
    assert c.value == pytest.approx(c.survival * c.success_ratio)
    assert "flavor gpu" in c.why


def test_no_history_anywhere_uses_the_defaults() -> None:
    scores = score_pools([], POOLS, 0.0, CFG)
    for s in scores:
        assert s.hazard_per_h == pytest.approx(CFG.default_hazard_per_h)
        assert s.survival == pytest.approx((4 / 5) ** (0.05 * 4))
        assert s.success_ratio == pytest.approx(CFG.default_success)


def _life(
    pool: str, inst: str, born: float, ready: float, left: float | None, reclaimed: bool
) -> list[E]:
    out = [
        E(f"{inst}:0", born, "p", pool, inst, "recorded", "", None, "requested"),
        E(f"{inst}:1", born, "p", pool, inst, "create_accepted", "", "requested", "creating"),
        E(f"{inst}:2", ready, "p", pool, inst, "node_joined", "", "active", "ready"),
    ]
    if left is not None:
        kind = "server_vanished" if reclaimed else "drain_requested"
        to = "gone" if reclaimed else "draining"
        out.append(E(f"{inst}:3", left, "p", pool, inst, kind, "", "ready", to))
    return out


def test_loader_and_scores_end_to_end(tmp_path: Path, chdb_path: Path) -> None:
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    log = SqlEventLog(store.engine)
    h = ClickHouseHistory(f"chdb://{chdb_path}", database="end_to_end")
    log.append(_life(A.id, "i1", 0.0, 120.0, 3720.0, reclaimed=True))
    log.append_raw([("junk", A.id, "not json")])
    loader = HistoryLoader(log, h)
    assert loader.drain() == 5
    assert loader.parked == 1
    scores = score_now(h, store, POOLS, 4000.0, CFG)
    assert [s.generation for s in scores] == [1, 1, 1]
    assert store.latest_scores()[A.id].reclaims == 1
    assert store.latest_scores()[A.id].why == scores[[s.pool for s in scores].index(A.id)].why
    h.close()
    store.close()


class _Rooms:
    """A provider's headroom and nothing else: all `sample_headroom` asks."""

    def __init__(self, room: dict[str, int]) -> None:
        self.room = room

    def headroom(self, pools: list[str]) -> dict[str, int]:
        return {p: self.room[p] for p in pools}


def test_scoring_job_writes_a_generation_only_when_it_says_something_new(tmp_path: Path) -> None:
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    log = SqlEventLog(store.engine)
    handed: list[float] = []
    job = ScoringJob(
        HistoryLoader(log, WindowedHistory(CFG.window_s)),
        store,
        POOLS,
        CFG,
        every_s=300.0,
        on_scores=lambda now, scores: handed.append(now),
    )
    assert job.due(0.0)
    first = job.run(0.0)
    assert [s.generation for s in first] == [1, 1, 1]
    assert not job.due(200.0)
    assert job.due(300.0)
    job.run(300.0)  # nothing happened: the planner is told, nothing is written
    assert (job.saved, handed) == (1, [0.0, 300.0])
    log.append(_life(A.id, "i1", 300.0, 400.0, 4000.0, reclaimed=True))
    moved = {s.pool: s for s in job.run(4200.0)}
    assert job.saved == 2
    assert moved[A.id].generation == 2
    assert moved[A.id].reclaims == 1
    assert store.latest_scores()[A.id].reclaims == 1
    job.run(4200.0 + 3600.0)  # an hour on, a generation is written even if unchanged
    assert job.saved == 3
    store.close()


def test_sampled_headroom_reaches_the_scores(tmp_path: Path) -> None:
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    log = SqlEventLog(store.engine)
    rooms = _Rooms({A.id: 4, B.id: 0, C.id: 2})
    assert sample_headroom(rooms, store, list(POOLS.values()), 100.0) == 3  # type: ignore[arg-type]
    rooms.room[A.id] = 6
    sample_headroom(rooms, store, list(POOLS.values()), 200.0)  # type: ignore[arg-type]
    log.absorb_outbox()
    job = ScoringJob(HistoryLoader(log, WindowedHistory(CFG.window_s)), store, POOLS, CFG)
    scores = {s.pool: s for s in job.run(300.0)}
    assert (scores[A.id].headroom, scores[A.id].headroom_n) == (5.0, 2)
    assert scores[B.id].headroom == 0.0
    store.close()


# ---------------------------------------------------------------- chDB held open
# Soak (issue 17): `sco history load` and `sco score --every` on chDB grew 36 % and 26 %
# in 25 minutes: each call opened the engine and closed it, and every opening on a
# folder with tables keeps about 1.3 MB that closing does not give back (chDB 4.4).
# A long-running process now holds the engine and hands the folder over only when
# another process asks for it.

HOLDER = """
import pathlib, sys, time
from sco.adapters.clickhouse.history import ClickHouseHistory
h = ClickHouseHistory(sys.argv[1], database="held", hold=True)
print("ready", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and pathlib.Path(sys.argv[2]).read_text() != "stop":
    h.count()  # a call every 50 ms, as a loader between loads
    time.sleep(0.05)
print("opened", h.opened, flush=True)
h.close()
"""


def test_a_held_engine_is_opened_once_and_memory_stays_flat(tmp_path: Path) -> None:
    import psutil

    h = ClickHouseHistory(f"chdb://{tmp_path / 'h'}", database="flat", hold=True)
    try:
        h.count()
        before = psutil.Process().memory_info().rss
        for _ in range(100):
            h.count()
        grown_mb = (psutil.Process().memory_info().rss - before) / 2**20
    finally:
        h.close()
    assert h.opened == 1
    assert grown_mb < 20  # opening and closing 100 times kept about 130 MB


def test_a_holder_hands_the_folder_to_another_process_and_takes_it_back(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys
    import time

    dsn = f"chdb://{tmp_path / 'h'}"
    flag = tmp_path / "flag"
    flag.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, dsn, str(flag)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        started = time.monotonic()
        other = ClickHouseHistory(dsn, database="held")  # one call at a time, as `sco score`
        try:
            assert other.count() == 0
        finally:
            other.close()
        handed_over_s = time.monotonic() - started
        flag.write_text("stop")
        out, _ = holder.communicate(timeout=60)
    finally:
        holder.kill()
    assert holder.returncode == 0
    assert handed_over_s < 5
    # It gave the folder up for the other process's calls, then opened it again.
    assert int(out.split()[-1]) >= 2


def test_the_history_loader_scores_in_its_own_process(tmp_path: Path) -> None:
    """`sco history load --score-every`: on chDB the loader holds the engine, and the
    scorer runs there too: events loaded, a generation written, a clean stop."""
    import signal
    import subprocess
    import sys
    import time

    state = tmp_path / "state.db"
    store = SqlFleetStore(sqlite_url(state))
    store.upsert_pools(list(POOLS.values()))
    t = time.time() - 3600  # within the scorer's window of the wall clock
    SqlEventLog(store.engine).append(_life(A.id, "i1", t, t + 100, t + 1800, reclaimed=True))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "history", "load", "--state", str(state),
         "--history", f"chdb://{tmp_path / 'history'}", "--score-every", "1s"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not store.latest_scores() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.5)
        scores = store.latest_scores()
        assert scores[A.id].reclaims == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        store.close()
    assert proc.returncode == 0, err
    assert "score generation 1" in err


def test_a_relative_chdb_url_is_a_folder_not_a_host(tmp_path: Path) -> None:
    """`chdb://history` in a file read from a relative path, and `chdb://dir/history`
    given as is, are folders (the file's, the working one's): read as URLs their first
    part was a host, and chDB said "Database history does not exist" (issue 28)."""
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "sco.yaml").write_text("history: {url: chdb://history}\n")
    code = (
        "from pathlib import Path\n"
        "from sco.assembly.settings import load\n"
        "from sco.adapters.clickhouse.history import ClickHouseHistory\n"
        "url = load(Path('fleet/sco.yaml')).history.url\n"
        "print(url)\n"
        "for dsn in (url, 'chdb://fleet/other'):\n"
        "    h = ClickHouseHistory(dsn, database='rel')\n"
        "    print(h.count())\n"
        "    h.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"chdb://{tmp_path / 'fleet' / 'history'}", "0", "0"]
    assert (tmp_path / "fleet" / "history").is_dir()
    assert (tmp_path / "fleet" / "other").is_dir()
