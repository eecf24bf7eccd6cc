"""Planner speed: the `sco` policy on a big partition, and its placement against HiGHS.

A partition of 20,000 instances over 200 spot pools in 3 halls (and a guaranteed
pool); 1,000 successive decisions, each after random changes of demand, pool
scores (hazard) and exclusions, each timed as the whole `sco` decision (spot
placement, hedge and floor). On a sample of decisions the placement's cost
(`sco.decide.placement.cost`) is compared with HiGHS solving the same
single-cycle problem exactly (an LP: one variable per possible replica, convex
costs). Prints one JSON object as its last line:
{"p50_ms": ..., "p99_ms": ..., "objective_gap_vs_milp": ...}.

    .venv/bin/python bench/planner.py [--decisions 1000] [--sample 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

from sco.decide.hedge import HedgeConfig, hazard_per_h
from sco.decide.placement import Slot, cost, place
from sco.decide.policies import ScoPolicy
from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.domain.instances import Instance
from sco.domain.lifecycle import State
from sco.domain.pools import CapacityClass, Pool
from sco.domain.snapshot import PartitionSnapshot, PoolView
from sco_harness.builders import instance, many_spot_pools, pool_score
from sco_harness.services import stop_on_signals

POOLS, HALLS, INSTANCES = 200, 3, 20_000


def pools(count: int = POOLS) -> list[Pool]:
    spot = many_spot_pools(count, halls=HALLS, flavors=1)
    return [*spot, Pool("bench", "hall-1", "gpu", CapacityClass.GUARANTEED, 1, 3.0)]


def instances(spot: list[Pool], rng: random.Random, count: int) -> tuple[Instance, ...]:
    ready = State.READY
    return tuple(
        instance(spot[rng.randrange(len(spot))], ready, partition_name="bench", ready_at=100.0)
        for _ in range(count)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decisions", type=int, default=1000)
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--instances", type=int, default=INSTANCES, help="smaller: a smoke run")
    ap.add_argument("--pools", type=int, default=POOLS)
    args = ap.parse_args()
    rng = random.Random(7)
    all_pools = pools(args.pools)
    spot = all_pools[:-1]
    insts = instances(spot, rng, args.instances)
    scale = args.instances / INSTANCES
    cfg = HedgeConfig()
    policy = ScoPolicy(cfg)
    part = Partition("bench", "bench", SchedulerKind.KUBERNETES)
    now = 86_400.0
    views = {
        p.id: PoolView(p, headroom=rng.randrange(0, 200), up_since=now - rng.uniform(0, 86_400))
        for p in spot
    }
    views[all_pools[-1].id] = PoolView(all_pools[-1], headroom=100_000)
    times: list[float] = []
    gaps: list[float] = []
    sample_every = max(1, args.decisions // max(1, args.sample))
    for k in range(args.decisions):
        for pid in rng.sample(sorted(p.id for p in spot), 10):  # scores, exclusions move
            v = views[pid]
            views[pid] = dataclasses.replace(
                v,
                score=pool_score(pid, rng.uniform(0.01, 2.0), exposure_h=100.0, reclaims=5),
                excluded=rng.random() < 0.05,
                headroom=rng.randrange(0, 200),
            )
        target = int(rng.randrange(18_000, 22_000) * scale)
        snap = PartitionSnapshot(
            partition=part,
            now=now + 30 * k,
            demand=Demand(target, target // 2, 30_000, 30_000),
            pools=views,
            instances=insts,
        )
        t0 = time.perf_counter()
        policy.decide(snap)
        times.append((time.perf_counter() - t0) * 1000)
        if k % sample_every == 0:
            gaps.append(placement_gap(snap, cfg, target))
    times.sort()
    print(
        json.dumps(
            {
                "decisions": len(times),
                "instances": args.instances,
                "pools": args.pools,
                "p50_ms": round(statistics.median(times), 2),
                "p99_ms": round(times[int(0.99 * (len(times) - 1))], 2),
                "objective_gap_vs_milp": round(max(gaps), 6) + 0.0 if gaps else None,  # no -0.0
                "gap_samples": len(gaps),
            }
        )
    )


def placement_gap(snap: PartitionSnapshot, cfg: HedgeConfig, want: int) -> float:
    """(planner cost - HiGHS cost) / |HiGHS cost| for the placement of `want` replicas."""
    held: dict[str, int] = {}
    for i in snap.instances:
        held[i.pool] = held.get(i.pool, 0) + 1
    slots = [
        Slot(
            v.pool.id,
            hazard_per_h(v, snap.now, cfg),
            held.get(v.pool.id, 0),
            held.get(v.pool.id, 0) + (0 if v.excluded else v.available),
        )
        for v in snap.pools.values()
        if v.pool.is_spot
    ]
    ours = cost(
        slots,
        place(slots, want, cfg.crowding_per_h, cfg.stickiness_per_h),
        cfg.crowding_per_h,
        cfg.stickiness_per_h,
    )
    exact = highs_cost(slots, want, cfg.crowding_per_h, cfg.stickiness_per_h)
    return (ours - exact) / max(abs(exact), 1e-9)


def highs_cost(slots: list[Slot], want: int, crowding: float, stickiness: float) -> float:
    """The same problem solved by HiGHS: x[p,k] in [0,1] is the k-th replica in p, at
    its marginal cost; sum x = want. Costs rise with k, so the LP optimum is integral."""
    import highspy
    import numpy as np

    costs: list[float] = []
    for s in slots:
        for k in range(1, s.room + 1):
            costs.append(s.hazard + crowding * (k - 1) - (stickiness if k <= s.held else 0.0))
    n = len(costs)
    want = min(want, n)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = 1
    lp.col_cost_ = np.array(costs)
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.array([float(want)])
    lp.row_upper_ = np.array([float(want)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(n + 1, dtype=np.int32)
    lp.a_matrix_.index_ = np.zeros(n, dtype=np.int32)
    lp.a_matrix_.value_ = np.ones(n)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.passModel(lp)
    h.run()
    return float(h.getInfo().objective_function_value)


if __name__ == "__main__":
    with stop_on_signals():
        main()
