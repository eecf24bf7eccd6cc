"""The plan phase of a partition's cycle: the snapshot the policy decides on, and the
plan generation that follows from a decision (a new one only when it changed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sco.decide.policies import Decision
from sco.domain.demand import Demand, Partition
from sco.domain.instances import Instance
from sco.domain.plans import Plan
from sco.domain.pools import Pool, PoolId
from sco.domain.signals import ExclusionState, PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.engine.signals import FleetSignals
from sco.ports import PoolRecord

# What a pool's view is made of (`snapshot_of`): pool, headroom, reserved, price, recent
# reclaims, last reclaim, last refusal, up since, score, version, undiscovered, exclusion.
MadeOf = tuple[
    Pool,
    int,
    int,
    float | None,
    int,
    float | None,
    float | None,
    float | None,
    PoolScore | None,
    int,
    bool,
    ExclusionState | None,
]


def snapshot_of(
    partition: Partition,
    pools: Mapping[PoolId, Pool],
    now: float,
    demand: Demand,
    *,
    headroom: Mapping[PoolId, int],
    prices: Mapping[PoolId, float],
    records: Mapping[PoolId, PoolRecord],
    signals: FleetSignals,
    refused_at: Mapping[PoolId, float],
    instances: Sequence[Instance],
    plan: Plan | None,
    measured_cold_start_n: int,
    handback: bool = False,
    busy: frozenset[str] = frozenset(),
    undiscovered: frozenset[PoolId] = frozenset(),
    seen: dict[PoolId, tuple[MadeOf, PoolView]] | None = None,
) -> PartitionSnapshot:
    """What the policy sees; a partition handed back wants nothing (floor 0 too). A
    pool `undiscovered` has no room and is excluded: what it holds stays, nothing new
    goes there. `seen`: the caller's views of the last snapshot, by what they were made
    of; a pool seen as before keeps its view (most pools, most cycles), and `seen`
    keeps the new ones."""
    views: dict[PoolId, PoolView] = {}
    for p, pool in pools.items():
        lost = p in undiscovered
        record = records.get(p)
        made_of: MadeOf = (
            pool,
            0 if lost else headroom.get(p, 0),
            record.reserved if record is not None else 0,
            prices.get(p),
            signals.recent_reclaims(p, now),
            signals.last_reclaim(p),
            refused_at.get(p),
            signals.up_since(p),
            signals.score(p),
            record.version if record is not None else 0,
            lost,
            signals.state(p, now),
        )
        last = seen.get(p) if seen is not None else None
        if last is not None and last[0] == made_of:
            views[p] = last[1]
            continue
        views[p] = view = _view(made_of, measured_cold_start_n)
        if seen is not None:
            seen[p] = (made_of, view)
    if handback:
        demand = Demand(0, 0, demand.max_units, demand.guaranteed_budget_units)
    return PartitionSnapshot(
        partition=partition,
        now=now,
        demand=demand,
        pools=views,
        instances=tuple(instances),
        plan=plan,
        busy=busy,
    )


def _view(made_of: MadeOf, measured_cold_start_n: int) -> PoolView:
    pool, room, reserved, price, recent, reclaim, refusal, up_since, score, version, lost, state = (
        made_of
    )
    return PoolView(
        pool=pool,
        headroom=room,
        reserved=reserved,
        price_per_h=price,
        recent_reclaims=recent,
        last_reclaim_at=reclaim,
        last_refusal_at=refusal,
        up_since=up_since,
        notice_s=pool.notice_s,
        cold_start_s=cold_start(pool, score, measured_cold_start_n),
        score=score,
        version=version,
        excluded=lost or state is ExclusionState.EXCLUDED,
        undiscovered=lost,
        degraded=state is ExclusionState.DEGRADED,
    )


def cold_start(pool: Pool, score: PoolScore | None, measured_n: int) -> float | None:
    """What the region file says, else what history measured (enough readies)."""
    if pool.cold_start_s is not None:
        return pool.cold_start_s
    measured = score is not None and score.ready_n >= measured_n
    return score.ready_p50_s if measured and score is not None else None


def next_plan(
    partition: str, current: Plan | None, decision: Decision, demand: Demand, now: float
) -> Plan | None:
    """The next plan generation, or None when the decision is the current plan's."""
    if current is not None and current.same_decision(
        decision.spot, decision.guaranteed, decision.notes, decision.pools
    ):
        return None
    return Plan(
        partition=partition,
        generation=(current.generation if current else 0) + 1,
        created_at=now,
        spot=dict(decision.spot),
        guaranteed=dict(decision.guaranteed),
        notes=decision.notes,
        pools=dict(decision.pools),
        # What the partition wanted when it was planned: for whoever reads the plan.
        terms={
            **decision.terms,
            "target_units": float(demand.target_units),
            "floor_units": float(demand.floor_units),
        },
    )
