"""Reading spot-capacity traces: one series per pool, headroom over time.

Two formats are read:
- CSV with header `date,availability`, one row per probe (UTC timestamps);
- JSON `{"metadata": {"gap_seconds": N}, "data": [v0, v1, ...]}`, one value per tick,
  starting at time 0.
A folder may also hold `spot_prices.json` (`{"<series>": [price per row]}`) and
`region.yaml` (see `RegionSpec`). Errors name the file and the field.
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sco.adapters.files import UnreadableFile, read_json, read_text, read_yaml
from sco.adapters.invalid import explain

PRICES_FILE = "spot_prices.json"
REGION_FILE = "region.yaml"
_EPOCH = datetime(1970, 1, 1)


class TraceError(ValueError):
    """A trace folder or file that cannot be used; the message names file and field."""

    def __init__(self, path: Path | str, field: str, message: str) -> None:
        super().__init__(f"{path}: {field}: {message}")
        self.path = str(path)
        self.field = field


class RegionSpec(BaseModel):
    """How a trace folder becomes a region. Every field may be left out."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="region name; default: the folder's name")
    flavor: str = Field("standard", description="flavor offered by every pool")
    units_per_instance: int = Field(1, ge=1, description="units one instance provides")
    halls: int = Field(3, ge=1, description="halls the series are spread over, round robin")
    hall_of: dict[str, str] = Field(
        default_factory=dict, description="series name -> hall, overriding round robin"
    )
    pool_size: int = Field(8, ge=1, description="instances a 1 stands for in a 0/1 trace")
    spot_price_per_h: float | None = Field(
        None, ge=0, description="spot price per instance-hour when there is no prices file"
    )
    guaranteed_price_per_h: float | None = Field(
        None, ge=0, description="guaranteed price per instance-hour; default 3x mean spot"
    )
    guaranteed_quota_per_hall: int = Field(
        16, ge=0, description="guaranteed instances each hall's pool may hold"
    )


@dataclass(frozen=True, slots=True)
class Series:
    """One pool's trace: value `values[i]` holds from `times[i]` to the next time."""

    name: str
    times: tuple[float, ...]
    values: tuple[int, ...]
    tick_s: float
    prices: tuple[float, ...] | None = None

    @property
    def start_s(self) -> float:
        return self.times[0]

    @property
    def end_s(self) -> float:
        return self.times[-1] + self.tick_s

    @property
    def binary(self) -> bool:
        return max(self.values) <= 1

    def index_at(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def value_at(self, t: float) -> int:
        return self.values[self.index_at(t)]

    def changes(self) -> list[tuple[float, int]]:
        """(time, value) where the value changes, the first point included."""
        out = [(self.times[0], self.values[0])]
        for t, v in zip(self.times[1:], self.values[1:], strict=True):
            if v != out[-1][1]:
                out.append((t, v))
        return out

    def price_changes(self) -> list[tuple[float, float]]:
        if self.prices is None:
            return []
        out = [(self.times[0], self.prices[0])]
        for t, p in zip(self.times[1:], self.prices[1:], strict=True):
            if p != out[-1][1]:
                out.append((t, p))
        return out


@dataclass(frozen=True, slots=True)
class TraceSet:
    folder: Path
    series: tuple[Series, ...]
    region: RegionSpec

    @property
    def start_s(self) -> float:
        return max(s.start_s for s in self.series)

    @property
    def end_s(self) -> float:
        """The shortest series bounds the set: beyond it some pool has no data."""
        return min(s.end_s for s in self.series)

    @property
    def mean_spot_price(self) -> float | None:
        prices = [p for s in self.series if s.prices for p in s.prices]
        return statistics.fmean(prices) if prices else None


def repeated(traces: TraceSet, until_s: float) -> tuple[TraceSet, int]:
    """The set, from its start to its end, played again and again until `until_s`; and
    how many times it plays (1: it was long enough)."""
    start, end = traces.start_s, traces.end_s
    if until_s <= end:
        return traces, 1
    span = end - start
    copies = math.ceil((until_s - start) / span)
    return TraceSet(
        traces.folder, tuple(_tiled(s, start, end, copies) for s in traces.series), traces.region
    ), copies


def _tiled(s: Series, start: float, end: float, copies: int) -> Series:
    kept = [i for i in range(s.index_at(start), len(s.times)) if s.times[i] < end]
    times = [max(s.times[i], start) for i in kept]
    span = end - start
    return Series(
        s.name,
        tuple(t + k * span for k in range(copies) for t in times),
        tuple(s.values[i] for _ in range(copies) for i in kept),
        s.tick_s,
        None if s.prices is None else tuple(s.prices[i] for _ in range(copies) for i in kept),
    )


def load_traces(folder: Path | str) -> TraceSet:
    """Every series in `folder` (and its `availability/`), with prices and region spec."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(folder, "folder", "not found or not a directory")
    files = sorted(
        [*folder.glob("*.csv"), *folder.glob("*.json"), *folder.glob("availability/*.csv")]
    )
    files = [f for f in files if f.name != PRICES_FILE]
    if not files:
        raise TraceError(folder, "folder", "holds no .csv or .json trace")
    series = [_read_series(f) for f in files]
    names = [s.name for s in series]
    if len(set(names)) != len(names):
        raise TraceError(folder, "folder", f"series names repeat: {sorted(names)}")
    prices = _read_prices(folder / PRICES_FILE, {s.name: len(s.values) for s in series})
    series = [Series(s.name, s.times, s.values, s.tick_s, prices.get(s.name)) for s in series]
    region = _read_region(folder / REGION_FILE)
    for name in region.hall_of:
        if name not in names:
            raise TraceError(folder / REGION_FILE, f"hall_of.{name}", "no such series")
    trace_set = TraceSet(folder, tuple(series), region)
    if trace_set.end_s <= trace_set.start_s:
        raise TraceError(folder, "folder", "the series do not overlap in time")
    return trace_set


def _read_series(path: Path) -> Series:
    if path.suffix == ".csv":
        times, values = _read_csv(path)
    else:
        times, values = _read_json(path)
    if not values:
        raise TraceError(path, "data", "no values")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if any(not 0 < g < math.inf for g in gaps) or not math.isfinite(times[0]):
        raise TraceError(path, "date", "times must be finite and increase strictly")
    tick_s = statistics.median(gaps) if gaps else 60.0
    return Series(path.stem, tuple(times), tuple(values), float(tick_s))


def _read_csv(path: Path) -> tuple[list[float], list[int]]:
    times: list[float] = []
    values: list[int] = []
    try:
        rows = list(csv.reader(io.StringIO(read_text(path), newline="")))
    except UnreadableFile as e:
        raise TraceError(path, "file", e.reason) from None
    except csv.Error as e:  # a field over the csv module's limit (128 KiB)
        raise TraceError(path, "csv", str(e)) from None
    header = rows[0] if rows else None
    if header is None or [h.strip() for h in header[:2]] != ["date", "availability"]:
        raise TraceError(path, "header", f"expected 'date,availability', got {header}")
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) < 2:
            raise TraceError(path, f"line {line}", f"expected 2 columns, got {row}")
        try:
            at = datetime.fromisoformat(row[0].strip())
            # Naive timestamps are UTC; subtracting the epoch is the fast way there.
            t = (at - _EPOCH).total_seconds() if at.tzinfo is None else at.timestamp()
        except (ValueError, OverflowError):  # not a date; a zone's offset off the calendar
            raise TraceError(path, f"line {line}: date", f"not a timestamp: {row[0]!r}") from None
        times.append(t)
        values.append(_count(path, f"line {line}: availability", row[1].strip()))
    return times, values


def _read_json(path: Path) -> tuple[list[float], list[int]]:
    try:
        doc: Any = read_json(path)
    except UnreadableFile as e:
        raise TraceError(path, "json", e.reason) from None
    if not isinstance(doc, dict):
        raise TraceError(path, "json", "expected an object with metadata and data")
    gap = (
        doc.get("metadata", {}).get("gap_seconds")
        if isinstance(doc.get("metadata"), dict)
        else None
    )
    gap_s = _finite(gap)
    if gap_s is None or gap_s <= 0:
        raise TraceError(path, "metadata.gap_seconds", f"must be a positive number, got {gap!r}")
    data = doc.get("data")
    if not isinstance(data, list):
        raise TraceError(path, "data", "must be a list of counts")
    values = [_count(path, f"data[{i}]", v) for i, v in enumerate(data)]
    return [i * gap_s for i in range(len(values))], values


def _count(path: Path, field: str, raw: object) -> int:
    if type(raw) is int and raw >= 0:
        return raw
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 18:
        return int(raw)
    if isinstance(raw, bool):
        raise TraceError(path, field, f"not a count: {raw!r}")
    try:
        # Not int(): "²" is a digit to str.isdigit, and a float may be 1e400.
        value = float(raw) if isinstance(raw, str | int | float) else math.nan
    except (ValueError, OverflowError):
        raise TraceError(path, field, f"not a count: {_shown(raw)}") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise TraceError(path, field, f"must be a whole number >= 0, got {_shown(raw)}")
    return int(value)


def _finite(raw: object) -> float | None:
    """A JSON number as a finite float, or None (not a number, NaN, infinite, or an
    integer beyond a float)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    try:
        value = float(raw)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _shown(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} chars)"


def _read_prices(path: Path, lengths: Mapping[str, int]) -> dict[str, tuple[float, ...]]:
    if not path.exists():
        return {}
    try:
        doc: Any = read_json(path)
    except UnreadableFile as e:
        raise TraceError(path, "json", e.reason) from None
    if not isinstance(doc, dict):
        raise TraceError(path, "json", "expected an object of series name -> prices")
    prices: dict[str, tuple[float, ...]] = {}
    for name, seq in doc.items():
        if name not in lengths:
            raise TraceError(path, name, "no such series")
        if not isinstance(seq, list) or len(seq) != lengths[name]:
            raise TraceError(path, name, f"must list {lengths[name]} prices, one per row")
        row = [_finite(p) for p in seq]
        if not all(p is not None and p >= 0 for p in row):
            raise TraceError(path, name, "prices must be finite numbers >= 0")
        prices[name] = tuple(p for p in row if p is not None)
    return prices


def _read_region(path: Path) -> RegionSpec:
    if not path.exists():
        return RegionSpec()
    try:
        doc = read_yaml(path) or {}
    except UnreadableFile as e:
        raise TraceError(path, "yaml", e.reason) from None
    try:
        return RegionSpec.model_validate(doc)
    except ValidationError as e:
        field, msg = explain(e, RegionSpec)
        raise TraceError(path, "region" if field == "file" else field, msg) from None


def hall_names(count: int) -> Sequence[str]:
    return [f"hall-{i + 1}" for i in range(count)]
