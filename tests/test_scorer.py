"""Scorer math against hand-computed cases, and pool history in chDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from sco.adapters.clickhouse.history import ClickHouseHistory
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore, sqlite_url
from sco.decide.scorer import PoolStats, ScorerConfig, beta_prior, gamma_prior, score_pools
from sco.domain.events import LifecycleEvent as E
from sco.runtime.signals_jobs import HistoryLoader, score_now
from sco.testing.builders import guaranteed_pool, spot_pool

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


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chDB runs one engine path per process: every test gets its own database in it."""
    return tmp_path_factory.mktemp("chdb")


def test_history_round_trip_in_chdb(chdb_path: Path) -> None:
    h = ClickHouseHistory(f"chdb://{chdb_path}", database="round_trip")
    events = (
        _life("P", "i1", 0.0, 120.0, 3720.0, reclaimed=True)
        + _life("P", "i2", 0.0, 300.0, None, reclaimed=False)
        + [
            E("f1", 50.0, "p", "P", "i3", "create_failed", "", "requested", "failed"),
            E("h1", 60.0, "", "P", None, "headroom", "", None, None, 3.0),
            E("h2", 70.0, "", "P", None, "headroom", "", None, None, 5.0),
        ]
    )
    h.load(events)
    h.load(events[:5])  # loaded twice: counted once
    assert h.count() == len(events)
    [s] = h.pool_stats(now=7500.0, window_s=86400.0)
    assert s.exposure_h == pytest.approx((3720 - 120 + 7500 - 300) / 3600)
    assert (s.reclaims, s.attempts, s.successes) == (1, 3, 2)
    assert (s.ready_p50_s, s.ready_n) == (pytest.approx(210.0), 2)
    assert (s.headroom, s.headroom_n) == (pytest.approx(4.0), 2)
    # A window that starts at 3600 s clips exposure and drops earlier attempts.
    [w] = h.pool_stats(now=7500.0, window_s=3900.0)
    assert w.exposure_h == pytest.approx((3720 - 3600 + 7500 - 3600) / 3600)
    assert (w.reclaims, w.attempts) == (1, 0)
    h.close()


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
