"""Demand files: constants, daily and stepped values, change times, and errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import sco
from sco.adapters.demandfile.intake import DemandFileError, FileDemandSource, read_demand_file
from sco.domain.demand import Demand, SchedulerKind
from sco_harness.builders import write_yaml

DAY = 86400.0
H = 3600.0
BUNDLED = Path(sco.__file__).parent / "data" / "demand"


def part(name: str = "a", **fields: object) -> dict[str, object]:
    doc: dict[str, object] = {"name": name, "kind": "slurm", "target_units": 1, "max_units": 10}
    doc.update(fields)
    return doc


def source(tmp_path: Path, *parts: dict[str, object], start_s: float = 0.0) -> FileDemandSource:
    path = write_yaml(tmp_path / "demand.yaml", {"partitions": list(parts)})
    return FileDemandSource.load(path, "r1", start_s)


def error_of(tmp_path: Path, text: str) -> DemandFileError:
    path = tmp_path / "demand.yaml"
    path.write_text(text)
    with pytest.raises(DemandFileError) as e:
        read_demand_file(path, "r1")
    assert e.value.path == str(path)
    assert str(path) in str(e.value)
    return e.value


def error_of_parts(tmp_path: Path, *parts: dict[str, object]) -> DemandFileError:
    return error_of(tmp_path, yaml.safe_dump({"partitions": list(parts)}))


# ---------------------------------------------------------------- values


def test_constants_hold_at_any_time(tmp_path: Path) -> None:
    src = source(
        tmp_path,
        part("web", kind="kubernetes", target_units=6, floor_units=4, max_units=12),
        start_s=1000.0,
    )
    for now in (0.0, 1000.0, 5 * DAY + 17.0):
        assert src.demand("web", now) == Demand(6, 4, 12, 12)
    assert src.next_change_after(1000.0) is None


def test_partitions_carry_region_kind_and_flavors(tmp_path: Path) -> None:
    src = source(
        tmp_path,
        part("batch", kind="slurm", flavors=["p3.2xlarge", "g5"]),
        part("web", kind="kubernetes"),
    )
    batch, web = src.partitions()
    assert (batch.name, batch.region, batch.kind) == ("batch", "r1", SchedulerKind.SLURM)
    assert batch.flavors == frozenset({"p3.2xlarge", "g5"})
    assert (web.name, web.kind, web.flavors) == ("web", SchedulerKind.KUBERNETES, frozenset())
    assert src.path == str(tmp_path / "demand.yaml")


def test_guaranteed_budget_defaults_to_max_units(tmp_path: Path) -> None:
    src = source(
        tmp_path,
        part("a", max_units=16),
        part("b", max_units=16, guaranteed_budget_units=4),
        part("c", max_units=16, guaranteed_budget_units=0),
    )
    assert src.demand("a", 0.0).guaranteed_budget_units == 16
    assert src.demand("b", 0.0).guaranteed_budget_units == 4
    assert src.demand("c", 0.0).guaranteed_budget_units == 0


def test_floor_defaults_to_zero(tmp_path: Path) -> None:
    src = source(tmp_path, part("a", target_units=3))
    assert src.demand("a", 0.0).floor_units == 0


def test_daily_follows_utc_time_of_day(tmp_path: Path) -> None:
    daily = {"00:00": 4, "09:00": 12, "19:30": 6}
    src = source(tmp_path, part("a", target_units={"daily": daily}, max_units=16), start_s=123.0)
    day3 = 3 * DAY
    assert src.demand("a", day3).target_units == 4
    assert src.demand("a", day3 + 9 * H - 1).target_units == 4
    assert src.demand("a", day3 + 9 * H).target_units == 12
    assert src.demand("a", day3 + 19.5 * H - 1).target_units == 12
    assert src.demand("a", day3 + 19.5 * H).target_units == 6
    assert src.demand("a", day3 + DAY - 1).target_units == 6
    assert src.demand("a", day3 + DAY).target_units == 4
    # The start of the run does not shift a daily schedule.
    assert src.demand("a", 9 * H).target_units == 12


def test_daily_wraps_to_the_previous_days_last_entry(tmp_path: Path) -> None:
    daily = {"18:00": 8, "06:00": 2}  # no entry at midnight, written out of order
    src = source(tmp_path, part("a", target_units={"daily": daily}))
    assert src.demand("a", 10 * DAY + 3 * H).target_units == 8
    assert src.demand("a", 10 * DAY).target_units == 8
    assert src.demand("a", 10 * DAY + 6 * H).target_units == 2
    assert src.demand("a", 10 * DAY + 12 * H).target_units == 2
    assert src.demand("a", 10 * DAY + 23 * H).target_units == 8


def test_daily_floor(tmp_path: Path) -> None:
    src = source(
        tmp_path, part("a", target_units=5, floor_units={"daily": {"08:00": 3, "20:00": 1}})
    )
    assert src.demand("a", 12 * H).floor_units == 3
    assert src.demand("a", 22 * H).floor_units == 1
    assert src.demand("a", 2 * H).floor_units == 1


def test_steps_are_offsets_from_the_start_and_the_last_holds(tmp_path: Path) -> None:
    steps = [[0, 6], [3600, 8], [7200, 3]]
    start = 50_000.0
    src = source(tmp_path, part("a", target_units={"steps": steps}), start_s=start)
    assert src.demand("a", start).target_units == 6
    assert src.demand("a", start + 3599).target_units == 6
    assert src.demand("a", start + 3600).target_units == 8
    assert src.demand("a", start + 7199.5).target_units == 8
    assert src.demand("a", start + 7200).target_units == 3
    assert src.demand("a", start + 30 * DAY).target_units == 3


def test_steps_before_the_first_offset_take_the_first_value(tmp_path: Path) -> None:
    src = source(tmp_path, part("a", target_units={"steps": [[600, 5], [1200, 7]]}), start_s=100.0)
    assert src.demand("a", 100.0).target_units == 5
    assert src.demand("a", 700.0).target_units == 5
    assert src.demand("a", 1300.0).target_units == 7


def test_the_same_file_against_two_starts(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "d.yaml",
        {"partitions": [part("a", target_units={"steps": [[0, 1], [100, 2]]})]},
    )
    early = FileDemandSource.load(path, "r1", 0.0)
    late = FileDemandSource.load(path, "r1", 1000.0)
    assert early.demand("a", 150.0).target_units == 2
    assert late.demand("a", 150.0).target_units == 1
    assert late.demand("a", 1100.0).target_units == 2


# ---------------------------------------------------------------- next change


def test_next_change_daily(tmp_path: Path) -> None:
    src = source(tmp_path, part("a", target_units={"daily": {"06:00": 2, "18:00": 8}}))
    day = 4 * DAY
    assert src.next_change_after(day) == day + 6 * H
    assert src.next_change_after(day + 6 * H) == day + 18 * H  # strictly after
    assert src.next_change_after(day + 17 * H) == day + 18 * H
    assert src.next_change_after(day + 18 * H) == day + DAY + 6 * H  # wraps to tomorrow
    assert src.next_change_after(day + 23 * H) == day + DAY + 6 * H


def test_next_change_steps(tmp_path: Path) -> None:
    start = 1000.0
    src = source(
        tmp_path, part("a", target_units={"steps": [[0, 1], [60, 2], [90, 3]]}), start_s=start
    )
    assert src.next_change_after(start) == start + 60
    assert src.next_change_after(start + 59.9) == start + 60
    assert src.next_change_after(start + 60) == start + 90
    assert src.next_change_after(start + 90) is None  # the last step holds for ever


def test_next_change_combines_partitions_and_floors(tmp_path: Path) -> None:
    start = 10 * DAY + 5 * H  # 05:00 UTC
    src = source(
        tmp_path,
        part("daily", target_units={"daily": {"06:00": 2, "18:00": 8}}),
        part(
            "stepped",
            target_units={"steps": [[0, 1], [7200, 2]]},
            floor_units={"steps": [[0, 0], [1800, 1]]},
        ),
        part("flat", target_units=3),
        start_s=start,
    )
    assert src.next_change_after(start) == start + 1800  # the floor of "stepped"
    assert src.next_change_after(start + 1800) == start + H  # 06:00 of "daily"
    assert src.next_change_after(start + H) == start + 7200  # "stepped" target
    assert src.next_change_after(start + 7200) == 10 * DAY + 18 * H
    assert src.next_change_after(10 * DAY + 18 * H) == 11 * DAY + 6 * H


# ---------------------------------------------------------------- bundled files


def test_bundled_demand_files_load() -> None:
    files = sorted(BUNDLED.glob("*.yaml"))
    assert {f.name for f in files} >= {"default.yaml", "demo.yaml"}
    for f in files:
        src = FileDemandSource.load(f, "r1", 0.0)
        assert src.partitions()
        for p in src.partitions():
            d = src.demand(p.name, 12 * H)
            assert d.floor_units <= d.max_units
            assert d.target_units <= d.max_units


def test_bundled_demo_demand() -> None:
    src = FileDemandSource.load(BUNDLED / "demo.yaml", "r1", 0.0)
    assert [p.name for p in src.partitions()] == ["slurm-batch", "k8s-service"]
    assert src.demand("slurm-batch", 10 * H) == Demand(12, 2, 16, 4)
    assert src.demand("slurm-batch", 3 * H).target_units == 4
    assert src.demand("k8s-service", 3 * H) == Demand(6, 4, 10, 10)
    assert src.next_change_after(0.0) == 7 * H


# ---------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(DemandFileError) as e:
        read_demand_file(path, "r1")
    assert e.value.field == "file"
    assert str(path) in str(e.value)
    assert "not found" in str(e.value)


def test_invalid_yaml(tmp_path: Path) -> None:
    assert error_of(tmp_path, "partitions: [\n  - name: a\n").field == "yaml"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("partitions: []\n", "partitions"),
        ("other: 1\n", "other"),  # an unknown key is told before a missing one
    ],
)
def test_no_partitions(tmp_path: Path, text: str, field: str) -> None:
    assert error_of(tmp_path, text).field == field


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n", "just words\n"])
def test_not_a_mapping(tmp_path: Path, text: str) -> None:
    assert error_of(tmp_path, text).field == "file"


def test_unknown_key_in_a_partition(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a"), part("b", colour="red"))
    assert err.field == "partitions[1].colour"


def test_unknown_top_level_key(tmp_path: Path) -> None:
    text = yaml.safe_dump({"partitions": [part("a")], "regions": ["x"]})
    assert error_of(tmp_path, text).field == "regions"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_units": -1}, "partitions[0].max_units"),
        ({"target_units": -1}, "partitions[0].target_units"),
        ({"floor_units": -2}, "partitions[0].floor_units"),
        ({"guaranteed_budget_units": -1}, "partitions[0].guaranteed_budget_units"),
        ({"target_units": {"daily": {"09:00": -1}}}, "partitions[0].target_units"),
        ({"target_units": {"steps": [[0, -1]]}}, "partitions[0].target_units"),
        ({"target_units": {"steps": [[-10, 1]]}}, "partitions[0].target_units"),
    ],
)
def test_negative_values(tmp_path: Path, fields: dict[str, object], field: str) -> None:
    assert error_of_parts(tmp_path, part("a", **fields)).field.startswith(field)


def test_floor_above_max(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a"), part("b", floor_units=11, max_units=10))
    assert err.field == "partitions[1].floor_units"
    assert "11" in str(err)


def test_a_daily_floor_above_max_at_any_hour(tmp_path: Path) -> None:
    err = error_of_parts(
        tmp_path, part("a", floor_units={"daily": {"00:00": 1, "12:00": 11}}, max_units=10)
    )
    assert err.field == "partitions[0].floor_units"


def test_target_above_max(tmp_path: Path) -> None:
    err = error_of_parts(
        tmp_path, part("a", target_units={"steps": [[0, 2], [60, 12]]}, max_units=10)
    )
    assert err.field == "partitions[0].target_units"
    assert "12" in str(err)


def test_target_at_max_is_fine(tmp_path: Path) -> None:
    src = source(tmp_path, part("a", target_units=10, floor_units=10, max_units=10))
    assert src.demand("a", 0.0) == Demand(10, 10, 10, 10)


@pytest.mark.parametrize("key", ["9am", "25:00", "12:60", "1200", "ab:cd"])
def test_bad_time_of_day(tmp_path: Path, key: str) -> None:
    err = error_of_parts(tmp_path, part("a", target_units={"daily": {key: 1}}))
    assert err.field.startswith("partitions[0].target_units")


@pytest.mark.parametrize(
    "steps", [[[100, 1], [50, 2]], [[100, 1], [100, 2]], []], ids=["down", "repeat", "empty"]
)
def test_steps_must_increase(tmp_path: Path, steps: list[list[int]]) -> None:
    err = error_of_parts(tmp_path, part("a", target_units={"steps": steps}))
    assert err.field.startswith("partitions[0].target_units")


def test_bad_time_of_day_message_says_what_is_wrong(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a", target_units={"daily": {"9am": 1}}))
    assert "HH:MM" in str(err)


def test_unordered_steps_message_says_what_is_wrong(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a", target_units={"steps": [[100, 1], [50, 2]]}))
    assert "increase" in str(err)


def test_duplicate_partition_names(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a"), part("b"), part("a"))
    assert err.field == "partitions[2].name"
    assert "'a'" in str(err)


@pytest.mark.parametrize("second", ["a-b", "A.B", "a_b", "a..b"])
def test_partition_names_that_would_share_a_feature_or_label_collide(
    tmp_path: Path, second: str
) -> None:
    """Defect 6 of issue 25: `a.b` and `a-b` became one Slurm feature, and each
    partition's clean-up deleted the other's idle nodes."""
    err = error_of_parts(tmp_path, part("a.b"), part(second))
    assert err.field == "partitions[1].name"
    assert "collides with 'a.b'" in str(err)


def test_unknown_kind(tmp_path: Path) -> None:
    err = error_of_parts(tmp_path, part("a", kind="nomad"))
    assert err.field == "partitions[0].kind"


@pytest.mark.parametrize("name", ["", "a b", "-lead"])
def test_bad_partition_name(tmp_path: Path, name: str) -> None:
    assert error_of_parts(tmp_path, part(name)).field == "partitions[0].name"


def test_missing_required_field(tmp_path: Path) -> None:
    doc = part("a")
    del doc["max_units"]
    assert error_of_parts(tmp_path, doc).field == "partitions[0].max_units"


def test_fractional_units_are_refused(tmp_path: Path) -> None:
    assert (
        error_of_parts(tmp_path, part("a", target_units=1.5)).field == "partitions[0].target_units"
    )
