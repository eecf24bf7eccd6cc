"""Demand of one partition, in units."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class SchedulerKind(StrEnum):
    KUBERNETES = "kubernetes"
    SLURM = "slurm"


@dataclass(frozen=True, slots=True)
class Partition:
    """One scheduler cluster in one region: the unit of sharding and blast radius.

    `flavors` restricts the pools the partition may use; empty means any flavor.
    """

    name: str
    region: str
    kind: SchedulerKind
    flavors: frozenset[str] = frozenset()

    def accepts(self, flavor: str) -> bool:
        return not self.flavors or flavor in self.flavors


def name_key(name: str) -> str:
    """What a partition's (or an installation's) name becomes where not every character
    may go: Slurm features, Kubernetes label values and Lease names keep letters and
    digits, fold case, and write anything else as '-'. Two names with one key would
    share a feature or a label, and each would take the other's nodes for its own."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


class DemandError(ValueError):
    """Demand numbers that cannot hold together; names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Gang:
    """Work that runs on `units` units at once (a job of many nodes) and is lost whole
    when any of them goes: its units belong in one pool. `run_s` is what it asks to run
    (its time limit), `checkpoint_s` how often it saves its work (it declared it); a
    reclaim costs it the work since its start or its last checkpoint. None: unknown."""

    units: int
    run_s: float | None = None
    checkpoint_s: float | None = None
    name: str = ""  # what the scheduler calls it (a job id), for the plan's reasons
    whole: bool = False  # the scheduler runs it only on units of one pool

    def __post_init__(self) -> None:
        if self.units < 1:
            raise DemandError("gangs", f"a gang has >= 1 unit, got {self.units}")
        for field_name in ("run_s", "checkpoint_s"):
            value = getattr(self, field_name)
            if value is not None and not value > 0:
                raise DemandError("gangs", f"{field_name} must be > 0, got {value}")

    def at_stake_s(self, default_s: float) -> float:
        """How long a run of it holds work a reclaim would lose: its run, or the
        interval between its checkpoints when shorter."""
        run = self.run_s if self.run_s is not None else default_s
        return min(run, self.checkpoint_s) if self.checkpoint_s is not None else run


def within(gangs: Sequence[Gang], wanted: int, target: int) -> tuple[Gang, ...]:
    """The gangs (in the queue's order) that a target capped below what is `wanted`
    still holds: what is not a gang (busy nodes, other work) comes first, as a queue
    runs it; a gang past the cap waits for room, not for nodes sco would make."""
    room = target - (wanted - sum(g.units for g in gangs))
    kept: list[Gang] = []
    for g in gangs:
        if g.units > room:
            break
        kept.append(g)
        room -= g.units
    return tuple(kept)


class CheckpointError(ValueError):
    """A checkpoint declaration (a Slurm job's comment, a pod's annotation) that cannot
    be read."""


_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def checkpoint_interval(value: str, declared: str) -> float:
    """Seconds between a gang's checkpoints, from what it declared (`30m`, `90s`,
    `1.5h`, seconds when bare); raises CheckpointError quoting `declared`."""
    m = _INTERVAL.match(value.strip())
    if m is None or float(m.group(1)) <= 0:
        raise CheckpointError(
            f"{declared!r}: want a duration > 0 in seconds, minutes or hours (e.g. 30m)"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True, slots=True)
class Demand:
    """What a partition wants at one moment.

    target: wanted now; floor: must be running on any class; max: never more;
    guaranteed_budget: the most units that may run on guaranteed capacity;
    guaranteed: of the target, units only guaranteed capacity may serve (work that
    asks for it, as a Slurm job's `--constraint=guaranteed`); unfit_work: pieces of
    work (jobs, pods) no node of the partition could ever run, reported and not
    counted; gangs: pending work of many units that must run together and needs new
    units (in the scheduler's order, the newest last), a part of the target.
    """

    target_units: int
    floor_units: int
    max_units: int
    guaranteed_budget_units: int
    guaranteed_units: int = 0
    unfit_work: int = 0
    gangs: tuple[Gang, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "target_units",
            "floor_units",
            "max_units",
            "guaranteed_budget_units",
            "guaranteed_units",
            "unfit_work",
        ):
            if getattr(self, name) < 0:
                raise DemandError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.floor_units > self.max_units:
            raise DemandError(
                "floor_units", f"floor {self.floor_units} exceeds max {self.max_units}"
            )
        if self.target_units > self.max_units:
            raise DemandError(
                "target_units", f"target {self.target_units} exceeds max {self.max_units}"
            )
        if self.guaranteed_units > self.target_units:
            raise DemandError(
                "guaranteed_units",
                f"guaranteed {self.guaranteed_units} exceeds target {self.target_units}",
            )

    @property
    def wanted_units(self) -> int:
        """Target, raised to the floor: the floor is a promise, the target a wish."""
        return max(self.target_units, self.floor_units)


# What an operator may ask of a partition (`sco handback`): give everything back.
HANDBACK = "handback"
