"""What a partition's cycle is configured with, what it tallies while it runs, and the
report it ends with."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sco.decide.acquirer import ActConfig
from sco.domain.instances import Instance
from sco.domain.lifecycle import LIVE, State
from sco.domain.pools import PoolId

# Where a cycle's wall time goes: listing the cloud, the scheduler's deadline work and
# listing (with the demand), reconciling records with what was seen, reading the fleet's
# signals, planning (the policy and the diff), acting (creates, drains, deletes and their
# records), publishing (the plan generation and the report).
PHASES = ("observe_cloud", "observe_scheduler", "sync", "signals", "plan", "act", "publish")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    act: ActConfig = field(default_factory=ActConfig)
    reservation_ttl_s: float = 600.0  # a reservation not seen as servers by then is swept
    list_grace_s: float = 60.0  # a new server may take this long to show in listings
    sweep_every_s: float = 600.0  # how often stale reservations are swept
    pool_refresh_s: float = 600.0  # planning may use pool reservation counts this old;
    # a create always re-reads them before it reserves
    measured_cold_start_n: int = 5  # readies in history before their median is the cold start
    # A ready node its scheduler has not listed as up for this long (a slurmctld that
    # lost its registration in a crash, a kubelet gone) is capacity no work reaches:
    # it fails, and its server is deleted and replaced.
    node_lost_after_s: float = 300.0


@dataclass
class CycleTally:
    """What one cycle did, for its report."""

    delays: list[float] = field(default_factory=list)
    acted: Counter[tuple[str, str]] = field(default_factory=Counter)
    reclaims: Counter[tuple[PoolId, str]] = field(default_factory=Counter)
    replaced: Counter[PoolId] = field(default_factory=Counter)
    created: int = 0  # instances whose creates the cloud took
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds, by PHASES
    _lap_at: float = field(default_factory=time.perf_counter)
    _started: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self._lap_at

    @property
    def took_s(self) -> float:
        """Wall seconds from the start to the last lap."""
        return self._lap_at - self._started

    def lap(self, phase: str) -> None:
        """Close a phase: the wall time since the last lap counts toward `phase` (a
        phase may come back, as planning does around publishing the plan)."""
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._lap_at
        self._lap_at = now


@dataclass(frozen=True, slots=True)
class Placement:
    """How demand and plan are met, in units: `placed` ready toward the target,
    `unplaced` target not yet ready, `mismatch` live units the plan does not want
    where they are (more in a pool than its target)."""

    placed: int
    unplaced: int
    mismatch: int


def placement_of(
    instances: Sequence[Instance], target: int, plan: Mapping[PoolId, int]
) -> Placement:
    ready = 0
    held: Counter[PoolId] = Counter()
    units: dict[PoolId, int] = {}
    for i in instances:
        state = i.state
        if state in LIVE:
            held[i.pool] += 1
            units[i.pool] = i.units
            if state is State.READY:
                ready += i.units
    mismatch = sum(max(0, n - plan.get(pool, 0)) * units[pool] for pool, n in held.items())
    placed = min(ready, target)
    return Placement(placed=placed, unplaced=max(0, target - ready), mismatch=mismatch)


@dataclass(frozen=True, slots=True)
class CycleReport:
    partition: str
    at: float
    plan_generation: int
    transitions: int
    created: int
    drained: int
    deleted: int
    degraded: str = ""
    notes: tuple[str, ...] = ()
    placement: Placement | None = None  # None when the cycle could not observe
    ready_delays_s: tuple[float, ...] = ()  # request to ready, of instances ready this cycle
    acted: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (action, reason): n
    reclaims: Mapping[tuple[PoolId, str], int] = field(default_factory=dict)  # (pool, kind): n
    replaced: Mapping[PoolId, int] = field(default_factory=dict)  # replacements created
    excluded: tuple[PoolId, ...] = ()  # pools this cycle planned as excluded or degraded
    handback: bool = False  # the partition is being handed back
    held: int = 0  # live instances after the cycle
    unfit_work: int = 0  # jobs or pods no node of the partition could run (not counted)
    floor_units: int = 0
    target_units: int = 0
    ready_units: int = 0  # of any class, ready in their scheduler
    instances: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (class, state): n
    cost_per_h: float = 0.0  # what the live instances cost, at the pools' current prices
    scored_at: float = 0.0  # when the pool scores in use were computed (0: none)
    took_s: float = 0.0  # how long the cycle took (wall time, for metrics)
    phases_s: Mapping[str, float] = field(default_factory=dict)  # of took_s, by PHASES


def by_class_and_state(live: Sequence[Instance]) -> dict[tuple[str, str], int]:
    """Live instances by (class, state) names; counted by the enums themselves, which
    thousands of instances each cycle make cheaper than by their names."""
    counted = Counter((i.capacity_class, i.state) for i in live)
    return {(c.value, st.value): n for (c, st), n in counted.items()}
