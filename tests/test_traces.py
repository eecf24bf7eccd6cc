"""Reading traces in both formats, and refusing bad ones with the file and field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sco.apps.common import bundled
from sco.lab.traces import TraceError, load_traces
from sco_harness.builders import write_json_trace


def test_bundled_csv_folder_with_prices() -> None:
    ts = load_traces(bundled("traces", "apache", "v100-9zone"))
    assert len(ts.series) == 9
    s = ts.series[0]
    assert s.name == "us-east-1a_v100_1"
    assert len(s.values) == 20158
    assert s.binary
    assert s.prices is not None
    assert len(s.prices) == 20158
    assert 190 < s.tick_s < 200  # probes every ~195 s
    assert ts.region.guaranteed_price_per_h == 3.06
    assert (ts.end_s - ts.start_s) / 86400 == pytest.approx(45.57, abs=0.05)


def test_bundled_json_folder() -> None:
    ts = load_traces(bundled("traces", "apache", "v100-4node"))
    assert [s.name for s in ts.series] == [
        "us-east-1f_v100_1",
        "us-east-2a_v100_1",
        "us-west-2c_v100_1",
    ]
    assert all(s.tick_s == 300 for s in ts.series)
    assert not ts.series[0].binary
    assert ts.start_s == 0


def test_value_lookup_and_changes(tmp_path: Path) -> None:
    write_json_trace(tmp_path, "a", [2, 2, 0, 0, 3], gap_s=100)
    s = load_traces(tmp_path).series[0]
    assert s.value_at(0) == 2
    assert s.value_at(199.9) == 2
    assert s.value_at(200) == 0
    assert s.value_at(10_000) == 3
    assert s.changes() == [(0.0, 2), (200.0, 0), (400.0, 3)]
    assert s.end_s == 500


def test_shortest_series_bounds_the_set(tmp_path: Path) -> None:
    write_json_trace(tmp_path, "a", [1] * 10, gap_s=60)
    write_json_trace(tmp_path, "b", [1] * 4, gap_s=60)
    assert load_traces(tmp_path).end_s == 240


def test_csv_rows(tmp_path: Path) -> None:
    (tmp_path / "z_1.csv").write_text(
        "date,availability\n2023-01-01 00:00:00,1\n2023-01-01 00:03:15,0\n"
    )
    s = load_traces(tmp_path).series[0]
    assert s.values == (1, 0)
    assert s.times[1] - s.times[0] == 195


@pytest.mark.parametrize(
    ("files", "field"),
    [
        ({"a.csv": "when,avail\n"}, "header"),
        ({"a.csv": "date,availability\nyesterday,1\n"}, "line 2: date"),
        ({"a.csv": "date,availability\n2023-01-01 00:00:00,-1\n"}, "line 2: availability"),
        ({"a.csv": "date,availability\n2023-01-01 00:00:00,x\n"}, "line 2: availability"),
        ({"a.json": '{"data": [1, 2]}'}, "metadata.gap_seconds"),
        ({"a.json": '{"metadata": {"gap_seconds": 0}, "data": [1]}'}, "metadata.gap_seconds"),
        ({"a.json": '{"metadata": {"gap_seconds": 60}, "data": [1, 1.5]}'}, "data[1]"),
        ({"a.json": '{"metadata": {"gap_seconds": 60}, "data": "x"}'}, "data"),
        ({"a.json": "{not json"}, "json"),
        ({"a.json": '{"metadata": {"gap_seconds": 60}, "data": []}'}, "data"),
    ],
)
def test_malformed_trace_names_file_and_field(
    tmp_path: Path, files: dict[str, str], field: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(TraceError) as e:
        load_traces(tmp_path)
    assert e.value.field == field
    assert str(tmp_path / next(iter(files))) in str(e.value)


def test_missing_and_empty_folders(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        load_traces(tmp_path / "nope")
    with pytest.raises(TraceError, match=r"no \.csv or \.json"):
        load_traces(tmp_path)


def test_prices_must_match_rows(tmp_path: Path) -> None:
    write_json_trace(tmp_path, "a", [1, 1, 1])
    (tmp_path / "spot_prices.json").write_text(json.dumps({"a": [1.0, 2.0]}))
    with pytest.raises(TraceError) as e:
        load_traces(tmp_path)
    assert e.value.field == "a"


def test_region_file_is_checked(tmp_path: Path) -> None:
    write_json_trace(tmp_path, "a", [1, 1, 1])
    (tmp_path / "region.yaml").write_text("halls: 0\n")
    with pytest.raises(TraceError) as e:
        load_traces(tmp_path)
    assert e.value.field == "halls"


# ---------------------------------------------------------------- what fuzzing found
# Regressions from bench/fuzz.py (issue 17): each of these files made the reader raise
# something other than TraceError (ValueError from int("²"), OverflowError from a
# float, csv.Error, UnicodeDecodeError, RecursionError, PyYAML's constructors' own
# errors), or accept a trace whose times are not finite.

CSV_HEAD = "date,availability\n"


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("a.csv", CSV_HEAD + "2023-02-15 22:08:16,²\n", "not a count"),
        ("a.csv", CSV_HEAD + "2023-02-15 22:08:16+25:00,1\n", "not a timestamp"),
        ("a.csv", CSV_HEAD + '"' + "x" * 200_000 + '",1\n', "csv"),
        ("a.csv", b"date,availability\n\xff\xfe,1\n", "not UTF-8"),
        ("a.json", '{"metadata": {"gap_seconds": 1e400}, "data": [1, 2]}', "gap_seconds"),
        ("a.json", '{"metadata": {"gap_seconds": NaN}, "data": [1, 2]}', "gap_seconds"),
        ("a.json", '{"metadata": {"gap_seconds": 60}, "data": [1e400]}', "whole number"),
        ("a.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("a.json", '{"metadata": {"gap_seconds": 1e308}, "data": [1, 2, 3]}', "finite"),
    ],
)
def test_unreadable_traces_are_trace_errors(
    tmp_path: Path, name: str, data: str | bytes, said: str
) -> None:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    with pytest.raises(TraceError, match=said):
        load_traces(tmp_path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("guaranteed_price_per_h: !!float ''\n", "a value cannot be read"),
        ("halls: 2024-02-30\n", "a value cannot be read"),
        ("halls: !!bool x\n", "a value cannot be read"),
        ("halls: " + "1" * 5000 + "\n", "a value cannot be read"),
    ],
)
def test_an_unreadable_sim_region_file_is_a_trace_error(
    tmp_path: Path, text: str, said: str
) -> None:
    write_json_trace(tmp_path, "a", [1, 2, 3])
    (tmp_path / "region.yaml").write_text(text)
    with pytest.raises(TraceError, match=said):
        load_traces(tmp_path)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\xff: 1\n", "not UTF-8"),
        (b"- " * 3000 + b"x\n", "nested too deeply"),
        (b"partitions: !!float ''\n", "a value cannot be read"),
    ],
)
def test_unreadable_region_and_demand_files_are_their_errors(
    tmp_path: Path, data: bytes, said: str
) -> None:
    from sco.adapters.demandfile.intake import DemandFileError, read_demand_file
    from sco.adapters.openstack.config import RegionFileError, load_region

    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    with pytest.raises(RegionFileError, match=said):
        load_region(path)
    with pytest.raises(DemandFileError, match=said):
        read_demand_file(path, "r1")
