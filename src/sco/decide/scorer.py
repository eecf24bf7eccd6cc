"""Pool scorer: what each pool's history says, shrunk toward its peers.

Per pool: reclaim hazard per instance-hour (Gamma–Poisson), survival over the
planning horizon, create success ratio (Beta–Binomial), median time to ready
and recent headroom, each with its sample size. The priors are fitted to the
pool's peers by the method of moments — peers are the pools of the same
flavor, else of the same hall, else all — so a pool with little history is
scored like its peers and one with much history by its own record.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sco.domain.pools import Pool, PoolId
from sco.domain.signals import PoolScore


class PoolStats(NamedTuple):
    """Raw counts from pool history over the scoring window. A NamedTuple: a scoring
    run makes one per pool, every 5 minutes of a run's clock."""

    pool: PoolId
    exposure_h: float = 0.0  # instance-hours held ready
    reclaims: int = 0
    attempts: int = 0  # creates answered (accepted or refused)
    successes: int = 0  # creates accepted
    ready_p50_s: float | None = None
    ready_n: int = 0
    headroom: float | None = None
    headroom_n: int = 0


@dataclass(frozen=True, slots=True)
class ScorerConfig:
    horizon_h: float = 1.0  # survival is over this long
    window_s: float = 7 * 86400.0  # history the scorer reads
    default_hazard_per_h: float = 0.05  # prior mean when no pool has any exposure
    default_success: float = 0.9  # prior mean when no pool has any attempt
    weak_strength: float = 4.0  # pseudo-observations behind a default or single-peer prior
    max_strength: float = 50.0  # the most a prior may weigh, in pseudo-observations/hours

    def __post_init__(self) -> None:
        if self.horizon_h <= 0 or self.window_s <= 0:
            raise ValueError("horizon_h and window_s must be > 0")


@dataclass(frozen=True, slots=True)
class GammaPrior:
    alpha: float  # pseudo-reclaims
    beta_h: float  # pseudo instance-hours
    source: str


@dataclass(frozen=True, slots=True)
class BetaPrior:
    mean: float
    strength: float  # pseudo-attempts
    source: str


def gamma_prior(group: Sequence[PoolStats], source: str, cfg: ScorerConfig) -> GammaPrior:
    """Method-of-moments Gamma prior on hazard from `group`'s reclaims and exposure.

    The spread of the pools' rates beyond what Poisson noise explains sets how
    strongly a pool is pulled toward the group mean; no extra spread means a
    prior as strong as `max_strength` hours.
    """
    seen = [s for s in group if s.exposure_h > 0]
    total_e = sum(s.exposure_h for s in seen)
    if total_e <= 0:
        strength = cfg.weak_strength
        return GammaPrior(cfg.default_hazard_per_h * strength, strength, "default")
    mean = sum(s.reclaims for s in seen) / total_e
    if len(seen) < 2:
        strength = cfg.weak_strength
        return GammaPrior(mean * strength, strength, source)
    spread = sum(s.exposure_h * (s.reclaims / s.exposure_h - mean) ** 2 for s in seen) / total_e
    between = spread - mean / (total_e / len(seen))
    beta = cfg.max_strength if between <= 0 else min(mean / between, cfg.max_strength)
    return GammaPrior(mean * beta, beta, source)


def beta_prior(group: Sequence[PoolStats], source: str, cfg: ScorerConfig) -> BetaPrior:
    """Method-of-moments Beta prior on create success from `group`'s attempts."""
    seen = [s for s in group if s.attempts > 0]
    total_n = sum(s.attempts for s in seen)
    if total_n <= 0:
        return BetaPrior(cfg.default_success, cfg.weak_strength, "default")
    mean = sum(s.successes for s in seen) / total_n
    if len(seen) < 2 or mean in (0.0, 1.0):
        return BetaPrior(mean, cfg.weak_strength if len(seen) < 2 else cfg.max_strength, source)
    spread = sum(s.attempts * (s.successes / s.attempts - mean) ** 2 for s in seen) / total_n
    between = spread - mean * (1 - mean) / (total_n / len(seen))
    if between <= 0:
        return BetaPrior(mean, cfg.max_strength, source)
    strength = min(max(mean * (1 - mean) / between - 1, 1.0), cfg.max_strength)
    return BetaPrior(mean, strength, source)


class Peers:
    """A pool's peers with history: same flavor, else same hall, else all spot pools.

    Built once per scoring run; each group's priors are fitted once.
    """

    def __init__(
        self,
        pools: Mapping[PoolId, Pool],
        stats: Mapping[PoolId, PoolStats],
        cfg: ScorerConfig,
        need: int = 2,
    ) -> None:
        self.cfg = cfg
        self.need = need
        self.groups: dict[str, list[PoolStats]] = {}
        self._known: Counter[str] = Counter()  # per group, its pools with any history
        for p in pools.values():
            if p.is_spot:
                s = stats.get(p.id, PoolStats(p.id))
                known = s.exposure_h > 0 or s.attempts > 0
                for key in (f"flavor {p.flavor}", f"hall {p.hall}", "all pools"):
                    self.groups.setdefault(key, []).append(s)
                    self._known[key] += known
        self._priors: dict[str, tuple[GammaPrior, BetaPrior]] = {}

    def source(self, pool: Pool) -> str:
        for key in (f"flavor {pool.flavor}", f"hall {pool.hall}"):
            if self._known[key] >= self.need:
                return key
        return "all pools"

    def priors(self, pool: Pool) -> tuple[GammaPrior, BetaPrior]:
        key = self.source(pool)
        if key not in self._priors:
            group = self.groups.get(key, [])
            self._priors[key] = (
                gamma_prior(group, key, self.cfg),
                beta_prior(group, key, self.cfg),
            )
        return self._priors[key]


def score_pools(
    stats: Sequence[PoolStats],
    pools: Mapping[PoolId, Pool],
    now: float,
    cfg: ScorerConfig,
    generation: int = 0,
) -> list[PoolScore]:
    """One score per spot pool in `pools`, ranked best first."""
    by_pool = {s.pool: s for s in stats}
    peers = Peers(pools, by_pool, cfg)
    out: list[PoolScore] = []
    for pool in pools.values():
        if not pool.is_spot:
            continue
        own = by_pool.get(pool.id, PoolStats(pool.id))
        g, b = peers.priors(pool)
        alpha, beta_h = g.alpha + own.reclaims, g.beta_h + own.exposure_h
        hazard = alpha / beta_h
        survival = (beta_h / (beta_h + cfg.horizon_h)) ** alpha
        success = (b.mean * b.strength + own.successes) / (b.strength + own.attempts)
        value = survival * success
        why = (
            f"hazard {hazard:.3f}/h from {own.reclaims} reclaims in {own.exposure_h:.1f} "
            f"inst-h (prior {g.alpha:.2f}/{g.beta_h:.1f}h, {g.source}); survival "
            f"{survival:.3f} over {cfg.horizon_h:g}h; success {success:.2f} from "
            f"{own.successes}/{own.attempts} (prior {b.mean:.2f}x{b.strength:.0f}, {b.source})"
        )
        out.append(
            PoolScore(
                pool=pool.id,
                generation=generation,
                computed_at=now,
                hazard_per_h=hazard,
                exposure_h=own.exposure_h,
                reclaims=own.reclaims,
                survival=survival,
                success_ratio=success,
                attempts=own.attempts,
                ready_p50_s=own.ready_p50_s,
                ready_n=own.ready_n,
                headroom=own.headroom,
                headroom_n=own.headroom_n,
                value=value if math.isfinite(value) else 0.0,
                why=why,
            )
        )
    out.sort(key=lambda s: (-s.value, s.pool))
    return out
