"""One seed, one world and one schedule of faults: everything the swarm draws from
its random source, drawn up front, so that a world can be run again exactly and a
failing schedule can be shrunk fault by fault."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

START_S = 1_800_000_000.0  # the simulated clock's start (2027-01-15)
BLUE = "blue"  # the installation under test
GREEN = "green"  # another sco in the same project, with a partition of the same name


class Kind(StrEnum):
    """What the adversary does, and to what (`Fault.target`)."""

    LIST_ERROR = "list_error"  # the cloud's listings fail
    CREATE_ERROR = "create_error"  # creates fail, nothing made
    CREATE_TIMEOUT = "create_timeout"  # creates time out, but took effect
    CREATE_REFUSED = "create_refused"  # no room, says the cloud
    DELETE_ERROR = "delete_error"  # deletes fail
    SLOW_CLOUD = "slow_cloud"  # every cloud call takes `value` seconds
    CREDENTIAL_EXPIRED = "credential_expired"  # nothing reaches the cloud
    SCHEDULER_DOWN = "scheduler_down"  # a partition's scheduler cannot be reached
    SCHEDULER_FORGETS = "scheduler_forgets"  # it forgets a node (a restart on old state)
    STORE_CONFLICT = "store_conflict"  # a replica's writes lose their races (`value`: odds)
    DATABASE_DOWN = "database_down"  # fleet state (and database leases) unreachable
    LEASE_LOSS = "lease_loss"  # a replica stalls past its leases' TTL
    TOKEN_RESET = "token_reset"  # a Kubernetes Lease is recreated: its token counts from 1
    TAKEOVER_MID_CYCLE = "takeover_mid_cycle"  # another replica leads while one is mid-cycle
    KILL = "kill"  # a replica dies before its `value`-th write, and a new one starts later
    CLOCK_SKEW = "clock_skew"  # a replica's clock runs `value` seconds off
    NOTICE = "notice"  # a reclaim notice to a server in the state `target` names
    RECLAIM = "reclaim"  # the reference reclaimer takes `value` servers of a hall back
    HANDBACK = "handback"  # the operator hands a partition back, and cancels at the end
    HEADROOM_STALE = "headroom_stale"  # placement's summaries too old: no room anywhere
    PRICE_SHIFT = "price_shift"  # a hall's prices move by `value` times
    POOL_MISSING = "pool_missing"  # discovery leaves pool `target` out (its aggregate gone)
    LEASE_API_DOWN = "lease_api_down"  # Kubernetes' API refuses the lease calls
    EVENTS_DOWN = "events_down"  # the event log refuses appends and reads (Kafka away)
    HISTORY_DOWN = "history_down"  # the scorer's history cannot be loaded or read
    NOTICE_MALFORMED = "notice_malformed"  # a server's sco:reclaim-at set by hand, mistyped
    CALLS_STALLED = "calls_stalled"  # a replica's call workers hang: its calls wait
    TOKEN_DELIVERY_DOWN = "token_delivery_down"  # the cloud refuses to set a node's token
    DISTRIBUTOR_DOWN = "distributor_down"  # the distributor cannot read fleet state
    IDS_REPEAT = "ids_repeat"  # a replica's id source gives again the last id it gave


ALL_KINDS = tuple(Kind)
# The port of the builder's bundle (`sco.engine.builder.Ports`) each kind of fault is
# at; the operator's hand-back is an order, not a fault of a port.
_AT_THE_CLOUD = (Kind.LIST_ERROR, Kind.CREATE_ERROR, Kind.CREATE_TIMEOUT, Kind.CREATE_REFUSED,
                 Kind.DELETE_ERROR, Kind.SLOW_CLOUD, Kind.CREDENTIAL_EXPIRED, Kind.NOTICE,
                 Kind.RECLAIM, Kind.HEADROOM_STALE, Kind.PRICE_SHIFT, Kind.POOL_MISSING,
                 Kind.NOTICE_MALFORMED)  # fmt: skip
PORTS_OF: dict[Kind, tuple[str, ...]] = {
    **dict.fromkeys(_AT_THE_CLOUD, ("provider",)),
    Kind.SCHEDULER_DOWN: ("nodes", "demand"),  # Slurm's demand is read from the same queue
    Kind.SCHEDULER_FORGETS: ("nodes",),
    **dict.fromkeys((Kind.STORE_CONFLICT, Kind.DATABASE_DOWN, Kind.KILL), ("state",)),
    **dict.fromkeys(
        (Kind.LEASE_LOSS, Kind.TOKEN_RESET, Kind.TAKEOVER_MID_CYCLE, Kind.LEASE_API_DOWN),
        ("leases",),
    ),
    Kind.CLOCK_SKEW: ("clock",),
    Kind.EVENTS_DOWN: ("events", "relay"),
    Kind.HISTORY_DOWN: ("history",),
    Kind.CALLS_STALLED: ("calls",),
    Kind.TOKEN_DELIVERY_DOWN: ("tokens",),
    Kind.IDS_REPEAT: ("ids",),
    # The distributor is a process of its own, not a port of the runner's.
    Kind.DISTRIBUTOR_DOWN: (),
    Kind.HANDBACK: (),
}
NOTICE_STATES = ("creating", "active", "ready", "draining", "noticed-sooner", "noticed-later")
# What a hand may write in a server's sco:reclaim-at instead of a deadline.
TYPOS = ("tomorrow", "1795950000s", "2027-13-01T00:00:00Z", "nan", "soon")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: Kind
    at_s: float  # from the world's start
    duration_s: float
    target: str = ""  # a partition, a replica, a hall or a lifecycle state, by kind
    value: float = 0.0

    def active(self, t_s: float) -> bool:
        return self.at_s <= t_s < self.at_s + self.duration_s

    def describe(self) -> str:
        what = f" {self.target}" if self.target else ""
        val = f" value={self.value:g}" if self.value else ""
        return f"{self.kind}{what} at {self.at_s:.0f}s for {self.duration_s:.0f}s{val}"


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    name: str
    kind: str  # "slurm", "kubernetes" or "static"
    floor: int
    max_units: int
    # (offset, target) for static; for Kubernetes, the workload in nodes' worth of pods
    targets: tuple[tuple[float, int], ...]
    jobs: tuple[tuple[float, float, bool], ...]  # (offset, run_s, requeue) for Slurm
    protected: int = 0  # Kubernetes: of the workload's pods, those do-not-disrupt


@dataclass(frozen=True, slots=True)
class PoolPlan:
    name: str
    hall: str
    capacity: tuple[tuple[float, int], ...]  # (offset, instances)


@dataclass(frozen=True, slots=True)
class WorldSpec:
    seed: int
    duration_s: float
    calm_s: float  # after the faults, a quiet tail in which everything must settle
    interval_s: float  # each controller's cycle
    notice_s: float  # the region's notice ahead of a trace's reclaims
    halls: int
    guaranteed_quota: int  # per hall
    pools: tuple[PoolPlan, ...]
    partitions: tuple[PartitionPlan, ...]
    leases: str  # "database" or "kubernetes"
    second_installation: bool
    faults: tuple[Fault, ...]

    def with_faults(self, faults: Sequence[Fault]) -> WorldSpec:
        return dataclasses.replace(self, faults=tuple(faults))

    @property
    def replicas(self) -> tuple[str, ...]:
        return ("r1", "r2")


def world_of(seed: int, kinds: Sequence[Kind] = ALL_KINDS, kube: bool = True) -> WorldSpec:
    """The world of `seed`: 1-4 partitions, 2-9 pools in 1-3 halls, notice 0-300 s, and
    6-14 faults of `kinds` at random times. `kube`: Kubernetes partitions may be drawn
    (the `kubernetes` extra is installed)."""
    rng = random.Random(seed)
    halls = rng.randint(1, 3)
    hall_names = [f"hall-{k + 1}" for k in range(halls)]
    duration = float(rng.choice([1800, 3600, 3600, 5400, 7200]))
    interval = 30.0  # the deadline windows below are two cycles long
    pools = tuple(
        PoolPlan(f"pool{k}", hall_names[k % halls], _capacity(rng, duration))
        for k in range(rng.randint(2, 9))
    )
    schedulers = ["slurm", "static"] + (["kubernetes"] if kube else [])
    partitions = tuple(
        _partition(rng, f"p{k}", rng.choice(schedulers), duration) for k in range(rng.randint(1, 4))
    )
    spec = WorldSpec(
        seed=seed,
        duration_s=duration,
        calm_s=900.0,
        interval_s=interval,
        notice_s=float(rng.choice([0, 30, 60, 120, 180, 300])),
        halls=halls,
        guaranteed_quota=rng.randint(2, 10),
        pools=pools,
        partitions=partitions,
        leases=rng.choice(["database", "kubernetes"]),
        second_installation=rng.random() < 0.3,
        faults=(),
    )
    faults = [_fault(rng, spec, kinds) for _ in range(rng.randint(6, 14))] if kinds else []
    return spec.with_faults(sorted(faults, key=lambda f: (f.at_s, f.kind)))


def _capacity(rng: random.Random, duration: float) -> tuple[tuple[float, int], ...]:
    out = [(0.0, rng.randint(2, 12))]
    t = 0.0
    while t < duration + 3600:
        t += rng.uniform(600, 2400)
        out.append((t, rng.choice([0, 1, 2, 4, 6, 8, 12])))
    return tuple(out)


def _partition(rng: random.Random, name: str, kind: str, duration: float) -> PartitionPlan:
    max_units = rng.randint(3, 10)
    floor = rng.randint(0, min(3, max_units))
    targets: list[tuple[float, int]] = []
    jobs: list[tuple[float, float, bool]] = []
    if kind == "slurm":
        t = 0.0
        while t < duration:
            jobs.append((t, rng.uniform(300, 2400), rng.random() < 0.9))
            t += rng.expovariate(1 / 240)
    else:
        t = 0.0
        while t < duration:
            targets.append((t, rng.randint(floor, max_units)))
            t += rng.uniform(600, 2400)
    pods = rng.randint(2, 2 * max_units) if kind == "kubernetes" else 0
    protected = rng.randint(0, pods // 3)
    return PartitionPlan(name, kind, floor, max_units, tuple(targets), tuple(jobs), protected)


def _fault(rng: random.Random, spec: WorldSpec, kinds: Sequence[Kind]) -> Fault:
    kind = rng.choice(list(kinds))
    at = rng.uniform(0, spec.duration_s * 0.85)
    duration = rng.uniform(10, 300)
    parts = [p.name for p in spec.partitions]
    target, value = "", 0.0
    if kind in (Kind.SCHEDULER_DOWN, Kind.SCHEDULER_FORGETS, Kind.HANDBACK, Kind.TOKEN_RESET):
        target = rng.choice(parts)
    elif kind in (Kind.LEASE_LOSS, Kind.CLOCK_SKEW, Kind.KILL, Kind.CALLS_STALLED,
                  Kind.IDS_REPEAT):  # fmt: skip
        target = rng.choice(spec.replicas)
        value = {Kind.CLOCK_SKEW: rng.uniform(-2, 2), Kind.KILL: rng.randint(1, 30)}.get(kind, 0)
    elif kind is Kind.TAKEOVER_MID_CYCLE:
        target = rng.choice(parts)
    elif kind is Kind.NOTICE:
        target = rng.choice(NOTICE_STATES)
        value = rng.uniform(0, 300)
    elif kind is Kind.RECLAIM:
        target = rng.choice([p.hall for p in spec.pools])
        value = rng.randint(1, 4)
    elif kind is Kind.STORE_CONFLICT:
        target = rng.choice(spec.replicas)
        value = rng.uniform(0.2, 0.6)  # the odds each write loses its race
    elif kind is Kind.SLOW_CLOUD:
        value = rng.uniform(1, 20)
    elif kind is Kind.PRICE_SHIFT:
        target = rng.choice([p.hall for p in spec.pools])
        value = rng.choice([0.25, 0.5, 2.0, 4.0])
    elif kind is Kind.NOTICE_MALFORMED:
        target = rng.choice(TYPOS)
    elif kind is Kind.POOL_MISSING:
        target = rng.choice(spec.pools).name
        duration = rng.uniform(300, 1800)  # read when a controller is made: make it last
    if kind in (
        Kind.NOTICE,
        Kind.RECLAIM,
        Kind.SCHEDULER_FORGETS,
        Kind.TAKEOVER_MID_CYCLE,
        Kind.NOTICE_MALFORMED,
    ):
        duration = 0.0 if kind is not Kind.TAKEOVER_MID_CYCLE else duration
    return Fault(kind, round(at, 1), round(duration, 1), target, round(value, 2))
