"""Small constructors for domain values with sensible defaults."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

from sco.domain.demand import Demand, Partition, SchedulerKind
from sco.domain.instances import Instance
from sco.domain.lifecycle import State
from sco.domain.plans import Plan
from sco.domain.pools import CapacityClass, Pool
from sco.domain.signals import PoolScore
from sco.domain.snapshot import PartitionSnapshot, PoolView

_ids = itertools.count(1)


def spot_pool(hall: str = "hall-1", zone: str = "a", price: float = 1.0, units: int = 1) -> Pool:
    return Pool("r1", hall, "gpu", CapacityClass.SPOT, units, price, aggregate=zone)


def many_spot_pools(count: int, halls: int = 3, flavors: int = 4) -> list[Pool]:
    """`count` spot pools of region "bench", spread round-robin over halls and flavors
    (benchmarks and large tests)."""
    return [
        Pool(
            "bench",
            f"hall-{i % halls + 1}",
            f"flavor-{i % flavors}" if flavors > 1 else "gpu",
            CapacityClass.SPOT,
            1,
            1.0,
            aggregate=f"z{i}",
        )
        for i in range(count)
    ]


def guaranteed_pool(hall: str = "hall-1", price: float = 3.0, units: int = 1) -> Pool:
    return Pool("r1", hall, "gpu", CapacityClass.GUARANTEED, units, price, aggregate="guaranteed")


def partition(name: str = "p1") -> Partition:
    return Partition(name, "r1", SchedulerKind.KUBERNETES)


def demand(
    target: int = 3, floor: int = 0, max_units: int = 100, budget: int | None = None
) -> Demand:
    return Demand(target, floor, max_units, max_units if budget is None else budget)


def instance(
    pool: Pool,
    state: State = State.READY,
    *,
    partition_name: str = "p1",
    created_at: float = 0.0,
    ready_at: float | None = None,
    server: bool = True,
    notice_deadline: float | None = None,
    drain_by: float | None = None,
    state_since: float | None = None,
) -> Instance:
    n = next(_ids)
    return Instance(
        id=f"inst-{n}",
        partition=partition_name,
        pool=pool.id,
        capacity_class=pool.capacity_class,
        units=pool.units_per_instance,
        state=state,
        version=1,
        request_id=f"req-{n}",
        plan_generation=1,
        created_at=created_at,
        state_since=created_at if state_since is None else state_since,
        server_id=f"srv-{n}" if server and state is not State.REQUESTED else None,
        ready_at=(created_at if ready_at is None else ready_at)
        if state is State.READY
        else ready_at,
        drain_by=drain_by,
        notice_deadline=notice_deadline,
    )


def pool_score(
    pool: str,
    hazard_per_h: float,
    *,
    exposure_h: float = 10.0,
    reclaims: int = 1,
    survival: float = 0.5,
    success_ratio: float = 1.0,
    attempts: int = 10,
) -> PoolScore:
    """A scorer's word on a pool, with the fields a decision reads."""
    return PoolScore(
        pool=pool,
        generation=1,
        computed_at=0.0,
        hazard_per_h=hazard_per_h,
        exposure_h=exposure_h,
        reclaims=reclaims,
        survival=survival,
        success_ratio=success_ratio,
        attempts=attempts,
        ready_p50_s=None,
        ready_n=0,
        headroom=None,
        headroom_n=0,
        value=survival * success_ratio,
        why="",
    )


def snapshot(
    views: Iterable[PoolView],
    instances: Sequence[Instance] = (),
    *,
    want: Demand | None = None,
    now: float = 10_000.0,
    plan: Plan | None = None,
    part: Partition | None = None,
) -> PartitionSnapshot:
    return PartitionSnapshot(
        partition=part or partition(),
        now=now,
        demand=want or demand(),
        pools={v.pool.id: v for v in views},
        instances=tuple(instances),
        plan=plan,
    )


def write_json_trace(folder: Path, name: str, values: Sequence[int], gap_s: int = 300) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_s}, "data": list(values)}))
    return path


def write_yaml(path: Path, doc: Mapping[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path


def simulated_state(state: Path, duration: str = "12h") -> Path:
    """Fleet state a `sco simulate` run wrote on the bundled 16-node trace."""
    import subprocess
    import sys

    traces = Path(__file__).resolve().parents[3] / "src/sco/data/traces/apache/v100-16node"
    sim = subprocess.run([sys.executable, "-m", "sco.apps.cli", "simulate", "--traces",
                          str(traces), "--duration", duration, "--state", str(state), "--json"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if sim.returncode != 0:
        raise AssertionError(f"sco simulate failed: {sim.stderr[-2000:]}")
    return state
