"""Batch back-off per pool: how many servers one create may ask of a pool, and when a
pool last refused.

A pool whose scheduler places all of a batch or none (Nova's "no valid host")
refuses big batches long before it is full: its batch is halved on refusals and
doubled back on acceptances, as Cluster Autoscaler backs off and recovers. Each
refusal (a create refused, servers the scheduler could not place, or a pool the
plan wants more of with no room left) is remembered with its time, which the
next snapshot carries (`PoolView.last_refusal_at`) for the policies that avoid
pools that refused (SpotHedge).

Pure: the state is a value, each function returns the next one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sco.domain.lifecycle import LIVE
from sco.domain.pools import PoolId
from sco.domain.snapshot import PartitionSnapshot


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pools' batches after refusals (a pool absent: as large as `max_batch`) and the
    last time each pool refused."""

    batch: Mapping[PoolId, int] = field(default_factory=dict)
    refused_at: Mapping[PoolId, float] = field(default_factory=dict)

    def cap(self, pool: PoolId, count: int) -> int:
        """The most one create may ask of `pool` now, for `count` wanted."""
        return min(count, self.batch.get(pool, count))


@dataclass(frozen=True, slots=True)
class Adapted:
    """The next back-off, and what changed, for the log: (pool, refused, new batch)."""

    backoff: Backoff
    halved: tuple[tuple[PoolId, int, int], ...] = ()


def adapt(
    state: Backoff,
    refusals: Mapping[PoolId, int],
    acceptances: Mapping[PoolId, int],
    max_batch: int,
    now: float,
) -> Adapted:
    """After a listing: halve the batch of each pool that refused (never below 1, and
    never above the refusals seen), double it back where creates were accepted and none
    refused; a pool back at `max_batch` follows the room again."""
    batch = dict(state.batch)
    refused_at = dict(state.refused_at)
    halved = []
    for pool, n in refusals.items():
        refused_at[pool] = now
        batch[pool] = max(1, min(batch.get(pool, max_batch), n) // 2)
        halved.append((pool, n, batch[pool]))
    for pool in acceptances.keys() - refusals.keys():
        if pool in batch:
            if batch[pool] * 2 >= max_batch:
                del batch[pool]
            else:
                batch[pool] *= 2
    return Adapted(Backoff(batch, refused_at), tuple(halved))


def refused(state: Backoff, pool: PoolId, at: float) -> Backoff:
    """A create of `pool` was refused (no capacity, quota, a bad request) at `at`."""
    return replace(state, refused_at={**state.refused_at, pool: at})


def no_room(
    state: Backoff, targets: Mapping[PoolId, int], snapshot: PartitionSnapshot, now: float
) -> Backoff:
    """A pool the plan wants more in but that has no room refuses as a launch there
    would: the next snapshot says so."""
    short = [p for p, n in targets.items() if n and p in snapshot.pools]
    if not short:
        return state
    live = Counter([i.pool for i in snapshot.instances if i.state in LIVE])
    full = [p for p in short if targets[p] > live[p] and snapshot.pools[p].available == 0]
    if not full:
        return state
    return replace(state, refused_at={**state.refused_at, **dict.fromkeys(full, now)})
