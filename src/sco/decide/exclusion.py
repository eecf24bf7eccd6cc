"""Exclusion decisions: when a pool's recent failures take it out of placement.

Thresholds are counts and a rate over a sliding window. The cooldown follows
Cluster Autoscaler's exponential backoff: it doubles on a new crossing only
when the previous exclusion has run out (not while backed off), is capped,
and starts over after a quiet period. A pool is never excluded when that
would leave fewer than `min_candidates` pools of its flavor class: it is
marked degraded instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sco.domain.pools import PoolId
from sco.domain.signals import Exclusion, ExclusionState


@dataclass(frozen=True, slots=True)
class ExclusionConfig:
    window_s: float = 600.0  # sliding window the thresholds look at
    max_reclaims: int = 3  # reclaimed instances in the window
    max_failures: int = 3  # refused creates in the window
    max_failure_ratio: float = 0.5  # refused / attempted creates in the window ...
    min_attempts: int = 4  # ... once at least this many were attempted
    base_cooldown_s: float = 600.0
    max_cooldown_s: float = 4 * 3600.0
    quiet_reset_s: float = 3600.0  # no crossing for this long: the next cooldown is the base
    min_candidates: int = 2  # pools of a flavor class that must stay placeable

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.base_cooldown_s <= 0:
            raise ValueError("window_s and base_cooldown_s must be > 0")
        if self.max_cooldown_s < self.base_cooldown_s:
            raise ValueError("max_cooldown_s must be >= base_cooldown_s")
        if not 0 < self.max_failure_ratio <= 1:
            raise ValueError("max_failure_ratio must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class WindowCounts:
    reclaims: int = 0
    failures: int = 0
    attempts: int = 0


def crossing(counts: WindowCounts, cfg: ExclusionConfig) -> str | None:
    """Why the counts cross a threshold, or None."""
    if counts.reclaims >= cfg.max_reclaims:
        return f"{counts.reclaims} reclaims in {cfg.window_s:.0f}s"
    if counts.failures >= cfg.max_failures:
        return f"{counts.failures} refused creates in {cfg.window_s:.0f}s"
    if counts.attempts >= cfg.min_attempts and counts.failures / counts.attempts >= (
        cfg.max_failure_ratio
    ):
        return f"{counts.failures}/{counts.attempts} creates refused in {cfg.window_s:.0f}s"
    return None


def state_for(
    pool: PoolId,
    class_pools: Iterable[PoolId],
    current: Mapping[PoolId, Exclusion],
    now: float,
    cfg: ExclusionConfig,
) -> ExclusionState:
    """Excluded, unless that would leave fewer than `min_candidates` placeable pools."""
    placeable = [
        p
        for p in class_pools
        if p != pool
        and not (
            p in current and current[p].state is ExclusionState.EXCLUDED and current[p].active(now)
        )
    ]
    if len(placeable) >= cfg.min_candidates:
        return ExclusionState.EXCLUDED
    return ExclusionState.DEGRADED


def on_crossing(
    pool: PoolId,
    previous: Exclusion | None,
    state: ExclusionState,
    reason: str,
    now: float,
    cfg: ExclusionConfig,
) -> Exclusion:
    """The exclusion after a crossing at `now`.

    While backed off (the previous one still active) nothing but the time of
    the last crossing changes; otherwise the cooldown doubles, or starts over
    at the base after a quiet period.
    """
    if previous is not None and previous.active(now):
        return dataclasses.replace(previous, last_crossing=now)
    if previous is None or now - previous.last_crossing >= cfg.quiet_reset_s:
        cooldown = cfg.base_cooldown_s
    else:
        cooldown = min(previous.cooldown_s * 2, cfg.max_cooldown_s)
    return Exclusion(
        pool=pool,
        state=state,
        since=now,
        until=now + cooldown,
        cooldown_s=cooldown,
        last_crossing=now,
        reason=reason,
        version=previous.version if previous is not None else 0,
    )
