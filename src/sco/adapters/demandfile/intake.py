"""A DemandSource read from a YAML demand file.

    partitions:
      - name: batch
        kind: slurm                 # or kubernetes
        flavors: [p3.2xlarge]       # optional; default any flavor
        target_units: {daily: {"00:00": 4, "09:00": 12, "19:00": 6}}
        floor_units: 0
        max_units: 16
        guaranteed_budget_units: 8  # optional; default max_units
      - name: web
        kind: kubernetes
        target_units: {steps: [[0, 6], [86400, 8]]}   # seconds from the start
        floor_units: 4
        max_units: 12

A value is a number, `{daily: {"HH:MM": n, ...}}` (UTC time of day, repeating),
or `{steps: [[offset_s, n], ...]}` (from the start of the run, the last holding).
Errors name the file and the field, e.g. `demand.yaml: partitions[1].floor_units: ...`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sco.adapters.files import UnreadableFile, parse_yaml, read_text
from sco.adapters.invalid import explain
from sco.domain.demand import Demand, Partition, SchedulerKind, name_key

DAY_S = 86400.0


class DemandFileError(ValueError):
    def __init__(self, path: Path | str, field: str, message: str) -> None:
        super().__init__(f"{path}: {field}: {message}")
        self.path = str(path)
        self.field = field
        self.reason = message


# Strict: `true` or "3" in a demand file is a mistake, not a number.
NonNegative = Annotated[int, Field(ge=0, strict=True)]


class _Daily(BaseModel):
    model_config = ConfigDict(extra="forbid")
    daily: dict[str, NonNegative]

    @field_validator("daily")
    @classmethod
    def _times(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("needs at least one HH:MM entry")
        for key in v:
            _time_of_day(key)
        return v


class _Steps(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: list[tuple[Annotated[float, Field(ge=0)], NonNegative]]

    @field_validator("steps")
    @classmethod
    def _ordered(cls, v: list[tuple[float, int]]) -> list[tuple[float, int]]:
        if not v:
            raise ValueError("needs at least one [offset_s, units] step")
        offsets = [o for o, _ in v]
        if offsets != sorted(offsets) or len(set(offsets)) != len(offsets):
            raise ValueError("offsets must increase strictly")
        return v


Value = NonNegative | _Daily | _Steps


class PartitionSpec(BaseModel):
    """One partition as a demand file (or `sco.yaml`'s `partitions`) gives it."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The partition's name: letters, digits, '_', '.', '-'.",
    )
    kind: SchedulerKind = Field(description="The scheduler its nodes join.")
    flavors: list[str] = Field(
        default_factory=list, description="Flavors its nodes may have (default: any)."
    )
    target_units: Value = Field(
        description="Units wanted: a number, {daily: {HH:MM: n}} (UTC) or "
        "{steps: [[offset_s, n], ...]}."
    )
    floor_units: Value = Field(
        default=0, description="Units kept at all times, on guaranteed capacity if need be."
    )
    max_units: NonNegative = Field(
        description="The most spot units it may hold, servers leaving apart (under a "
        "reclaim notice, drained or being deleted: their replacements come first). "
        "Guaranteed units that cover spot not ready yet, or reclaimed, come on top, "
        "within guaranteed_budget_units."
    )
    guaranteed_budget_units: NonNegative | None = Field(
        default=None, description="The most guaranteed units it may hold (default: max_units)."
    )

    @field_validator("target_units", "floor_units", mode="before")
    @classmethod
    def _one_form(cls, v: object) -> object:
        """Pick the form by its key, so an error speaks of that form and not of the others."""
        if not isinstance(v, dict):
            return v
        forms: dict[str, type[BaseModel]] = {"daily": _Daily, "steps": _Steps}
        if len(v) != 1 or next(iter(v)) not in forms:
            raise ValueError("must be a number, {daily: {HH:MM: n}} or {steps: [[offset_s, n]]}")
        key = next(iter(v))
        try:
            return forms[key].model_validate(v)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"{where}: {err['msg']}") from None


class _DemandFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partitions: list[PartitionSpec] = Field(min_length=1)


def _time_of_day(key: str) -> float:
    try:
        hh, mm = key.split(":")
        h, m = int(hh), int(mm)
    except ValueError:
        raise ValueError(f"{key!r} is not HH:MM") from None
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError(f"{key!r} is not a time of day")
    return h * 3600.0 + m * 60.0


@dataclass(frozen=True, slots=True)
class UnitSeries:
    """A piecewise-constant number of units over time."""

    constant: int | None = None
    daily: tuple[tuple[float, int], ...] = ()  # (second of day, units), sorted
    steps: tuple[tuple[float, int], ...] = ()  # (offset from start, units), sorted

    def values(self) -> list[int]:
        if self.constant is not None:
            return [self.constant]
        return [v for _, v in (self.daily or self.steps)]

    def at(self, t: float, start_s: float) -> int:
        if self.constant is not None:
            return self.constant
        if self.daily:
            sod = t % DAY_S
            i = bisect.bisect_right([s for s, _ in self.daily], sod) - 1
            return self.daily[i][1]  # i == -1 wraps to the last entry of the previous day
        i = bisect.bisect_right([o for o, _ in self.steps], t - start_s) - 1
        return self.steps[max(i, 0)][1]

    def next_change_after(self, t: float, start_s: float) -> float | None:
        if self.constant is not None:
            return None
        if self.daily:
            day0 = math.floor(t / DAY_S) * DAY_S
            for day in (day0, day0 + DAY_S):
                for sod, _ in self.daily:
                    if day + sod > t:
                        return day + sod
            return None
        later = [start_s + o for o, _ in self.steps if start_s + o > t]
        return later[0] if later else None


def _series(v: int | _Daily | _Steps) -> UnitSeries:
    if isinstance(v, int):
        return UnitSeries(constant=v)
    if isinstance(v, _Daily):
        return UnitSeries(daily=tuple(sorted((_time_of_day(k), n) for k, n in v.daily.items())))
    return UnitSeries(steps=tuple((float(o), n) for o, n in v.steps))


@dataclass(frozen=True, slots=True)
class PartitionDemand:
    partition: Partition
    target: UnitSeries
    floor: UnitSeries
    max_units: int
    guaranteed_budget_units: int


class FileDemandSource:
    """Demand per partition from a YAML file, evaluated against a start time."""

    def __init__(self, specs: Sequence[PartitionDemand], start_s: float, path: str = "") -> None:
        self._specs = {s.partition.name: s for s in specs}
        self.start_s = start_s
        self.path = path

    @classmethod
    def load(cls, path: Path | str, region: str, start_s: float) -> FileDemandSource:
        return cls(read_demand_file(path, region), start_s, str(path))

    def partitions(self) -> Sequence[Partition]:
        return [s.partition for s in self._specs.values()]

    def demand(self, partition: str, now: float) -> Demand:
        s = self._specs[partition]
        return Demand(
            target_units=s.target.at(now, self.start_s),
            floor_units=s.floor.at(now, self.start_s),
            max_units=s.max_units,
            guaranteed_budget_units=s.guaranteed_budget_units,
        )

    def next_change_after(self, now: float) -> float | None:
        times = [
            t
            for s in self._specs.values()
            for series in (s.target, s.floor)
            if (t := series.next_change_after(now, self.start_s)) is not None
        ]
        return min(times) if times else None


def read_demand_file(path: Path | str, region: str) -> list[PartitionDemand]:
    """Parse and check a demand file; raises DemandFileError naming file and field."""
    path = Path(path)
    try:
        text = read_text(path)
    except UnreadableFile as e:
        raise DemandFileError(path, "file", "not found" if e.missing else e.reason) from None
    try:
        raw: Any = parse_yaml(text)
    except UnreadableFile as e:
        raise DemandFileError(path, "yaml", e.reason.removeprefix("not YAML: ")) from None
    try:
        doc = _DemandFile.model_validate(raw)
    except ValidationError as e:
        raise DemandFileError(path, *explain(e, _DemandFile)) from None
    return demand_of(doc.partitions, region, str(path))


def demand_of(specs: Sequence[PartitionSpec], region: str, where: str) -> list[PartitionDemand]:
    """Check partitions that parsed (names unique, floor and target within max); raises
    DemandFileError naming `where` (the file) and the field."""
    path = where
    out: list[PartitionDemand] = []
    names: dict[str, str] = {}  # key -> the name that has it
    for i, p in enumerate(specs):
        where = f"partitions[{i}]"
        if p.name in names.values():
            raise DemandFileError(path, f"{where}.name", f"{p.name!r} appears twice")
        other = names.setdefault(name_key(p.name), p.name)
        if other != p.name:
            raise DemandFileError(
                path,
                f"{where}.name",
                f"{p.name!r} collides with {other!r}: both are {name_key(p.name)!r} in a "
                "Slurm feature, a Kubernetes label and a Lease name; rename one",
            )
        target, floor = _series(p.target_units), _series(p.floor_units)
        if max(floor.values()) > p.max_units:
            raise DemandFileError(
                path,
                f"{where}.floor_units",
                f"floor {max(floor.values())} exceeds max_units {p.max_units}",
            )
        if max(target.values()) > p.max_units:
            raise DemandFileError(
                path,
                f"{where}.target_units",
                f"target {max(target.values())} exceeds max_units {p.max_units}",
            )
        budget = p.max_units if p.guaranteed_budget_units is None else p.guaranteed_budget_units
        partition = Partition(p.name, region, p.kind, frozenset(p.flavors))
        out.append(PartitionDemand(partition, target, floor, p.max_units, budget))
    return out
