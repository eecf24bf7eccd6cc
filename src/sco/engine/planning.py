"""The plan phase of a partition's cycle: the snapshot the policy decides on, and the
plan generation published when the decision changes."""

from __future__ import annotations

import logging

from sco.decide.policies import Decision
from sco.domain.demand import Demand
from sco.domain.plans import Plan
from sco.domain.pools import Pool
from sco.domain.signals import ExclusionState, PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco.engine.partition_state import PartitionState
from sco.ports import (
    FencedOut,
    StateConflict,
)

log = logging.getLogger("sco.engine.controller")


class Planning(PartitionState):
    def _snapshot(
        self,
        now: float,
        demand: Demand,
        handback: bool = False,
        busy: frozenset[str] = frozenset(),
    ) -> PartitionSnapshot:
        """What the policy sees; a partition handed back wants nothing (floor 0 too)."""
        ids = list(self._pools)
        headroom = self.provider.headroom(ids)
        prices = self.provider.prices(ids)
        records = self._records_of_pools(now)
        views = {}
        signals = self.signals
        for p, pool in self._pools.items():
            state = signals.state(p, now)
            score = signals.score(p)
            views[p] = PoolView(
                pool=pool,
                headroom=headroom.get(p, 0),
                reserved=records[p].reserved if p in records else 0,
                price_per_h=prices.get(p),
                recent_reclaims=signals.recent_reclaims(p, now),
                last_reclaim_at=signals.last_reclaim(p),
                last_refusal_at=self._refused_at.get(p),
                up_since=signals.up_since(p),
                notice_s=pool.notice_s,
                cold_start_s=self._cold_start(pool, score),
                score=score,
                version=records[p].version if p in records else 0,
                excluded=state is ExclusionState.EXCLUDED,
                degraded=state is ExclusionState.DEGRADED,
            )
        if handback:
            demand = Demand(0, 0, demand.max_units, demand.guaranteed_budget_units)
        return PartitionSnapshot(
            partition=self.partition,
            now=now,
            demand=demand,
            pools=views,
            instances=tuple(self._live()),
            plan=self._plan,
            busy=busy,
        )

    def _cold_start(self, pool: Pool, score: PoolScore | None) -> float | None:
        """What the region file says, else what history measured (enough readies)."""
        if pool.cold_start_s is not None:
            return pool.cold_start_s
        measured = score is not None and score.ready_n >= self.config.measured_cold_start_n
        return score.ready_p50_s if measured and score is not None else None

    def _publish_plan(self, decision: Decision, now: float, demand: Demand) -> Plan:
        current = self._plan
        if current is not None and current.same_decision(
            decision.spot, decision.guaranteed, decision.notes, decision.pools
        ):
            return current
        plan = Plan(
            partition=self.partition.name,
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
        try:
            self.store.save_plan(plan)
        except FencedOut:
            self._plan_loaded = False
            raise
        except StateConflict as e:
            log.warning("partition %s: %s; reloading plan", self.partition.name, e)
            self._plan_loaded = False
            return current or plan
        log.info(
            "partition %s: plan generation %d spot=%s guaranteed=%s %s",
            self.partition.name,
            plan.generation,
            {p: n for p, n in plan.spot.items() if n},
            {p: n for p, n in plan.guaranteed.items() if n},
            "; ".join(plan.notes),
        )
        self._plan = plan
        return plan
