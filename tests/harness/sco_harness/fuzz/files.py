"""The files an operator gives sco: `sco.yaml`, the OpenStack region file, demand files,
and trace folders (JSON and CSV traces, spot prices, the simulator's `region.yaml`)."""

from __future__ import annotations

import csv
import io
import math
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from sco.adapters.demandfile.intake import DemandFileError, FileDemandSource, read_demand_file
from sco.adapters.openstack.config import RegionFileError, load_region
from sco.decide.policies import UnknownPolicy
from sco.lab.region import SimConfig, SimRegion
from sco.lab.simulation import Simulation, SimulationInputError, SimulationSpec
from sco.lab.traces import TraceError, load_traces
from sco_harness.fuzz import AppHooks, Check, Judge, Target
from sco_harness.fuzz.values import dump_json, dump_yaml, file_bytes, mutated


def vocabulary(*docs: Any) -> list[str]:
    """Every key of the documents, to mutate with names the parser knows."""
    out: set[str] = set()

    def walk(d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                out.add(str(k))
                walk(v)
        elif isinstance(d, list):
            for v in d:
                walk(v)

    for d in docs:
        walk(d)
    return sorted(out)


def bundled(*parts: str) -> Path:
    return Path(str(resources.files("sco").joinpath("data", *parts)))


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------- sco.yaml

SLURM_PARTITION: dict[str, Any] = {
    "name": "batch",
    "kind": "slurm",
    "demand": "slurm",
    "target_units": 0,
    "floor_units": 1,
    "max_units": 16,
    "guaranteed_budget_units": 4,
    "flavors": ["p3.2xlarge"],
    "agents": True,
    "slurm": {
        "cluster": "hpc",
        "partitions": ["batch", "gpu"],
        "cpus": 4,
        "memory_mb": 15000,
        "gres": {"gpu": 1},
        "requeue_lead_s": 30,
        "idle_keep_s": 300,
    },
}
KUBE_PARTITION: dict[str, Any] = {
    "name": "web",
    "kind": "kubernetes",
    "demand": "kubernetes",
    "target_units": 0,
    "floor_units": 2,
    "max_units": 8,
    "kubernetes": {
        "cluster": "main",
        "labels": {"pool": "web"},
        "allocatable": {"cpu": "4", "memory": "15Gi", "pods": "110", "nvidia.com/gpu": "1"},
        "daemonset_overhead": {"cpu": "100m", "memory": "200Mi"},
        "spot_taint": True,
    },
}
STATIC_PARTITION: dict[str, Any] = {
    "name": "svc",
    "kind": "kubernetes",
    "target_units": {"daily": {"00:00": 2, "09:00": 4, "19:30": 3}},
    "floor_units": {"steps": [[0, 1], [3600, 2]]},
    "max_units": 6,
}
CONFIGS: list[dict[str, Any]] = [
    {},
    {
        "state": {"url": "sqlite:///sco-state.sqlite"},
        "events": {"kind": "embedded"},
        "history": {"url": "chdb://sco-history"},
        "leases": {"kind": "database", "ttl_s": 15},
        "provider": {"kind": "openstack", "cloud": "mycloud", "region_file": "region.yaml"},
        "partitions": [
            {
                "name": "batch",
                "kind": "slurm",
                "target_units": 8,
                "floor_units": 2,
                "max_units": 16,
            },
        ],
        "policy": {"name": "sco", "interval_s": 15, "hedge": {"max_spare": 2}},
        "http": {"bind": "0.0.0.0", "run_port": 9100},
        "log": {"level": "info", "format": "text"},
    },
    {
        "state": {"url": "postgresql+psycopg://sco:secret@db1,db2/sco"},
        "events": {
            "kind": "kafka",
            "kafka": {
                "brokers": "k1:9092,k2:9092",
                "topic_prefix": "sco.events.",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "sco",
                "sasl_password": "secret",
                "ssl_ca_location": "ca.pem",
                "regions": ["r1", "r2"],
                "new_topic_partitions": 3,
                "client": {"linger.ms": "5"},
            },
        },
        "history": {
            "url": "http://ch:8123",
            "database": "sco",
            "username": "u",
            "password": "p",
        },
        "leases": {
            "kind": "kubernetes",
            "ttl_s": 20,
            "kubernetes": {"namespace": "sco", "kubeconfig": "kube.yaml", "context": "c"},
        },
        "provider": {
            "kind": "openstack",
            "cloud": "c",
            "region_file": "/etc/sco/region.yaml",
            "clouds_file": "clouds.yaml",
        },
        "partitions": [SLURM_PARTITION, KUBE_PARTITION, STATIC_PARTITION],
        "slurm": {
            "hpc": {"conf": "slurm.conf", "bin_dir": "/usr/bin", "timeout_s": 10, "cache_s": 2}
        },
        "kubernetes": {
            "main": {
                "kubeconfig": "~/.kube/config",
                "context": "ctx",
                "timeout_s": 10,
                "watch_timeout_s": 300,
                "grace_s": 30,
            }
        },
        "policy": {
            "name": "spothedge",
            "interval_s": 30,
            "hedge": {"max_spare": 1, "cold_start_s": 120.0, "cover_target": False},
            "controller": {
                "reservation_ttl_s": 600,
                "list_grace_s": 60,
                "act": {"max_batch": 10, "drain_s": 60},
            },
            "exclusion": {"window_s": 600, "max_reclaims": 3, "base_cooldown_s": 600},
            "scorer": {"horizon_h": 1.0, "window_s": 604800},
            "score_every_s": 300,
        },
        "http": {"bind": "127.0.0.1", "run_port": 0, "watch_port": 9101, "status_port": 9104},
        "distributor": {
            "bind": "0.0.0.0",
            "port": 8443,
            "tls_cert": "c.pem",
            "tls_key": "k.pem",
            "max_wait_s": 60,
            "poll_s": 0.25,
            "lease_s": 300,
            "token_ttl_s": 2592000,
            "auth_failures_per_min": 30,
            "requests_per_s": 5,
        },
        "log": {"level": "debug", "format": "json"},
    },
    {"demand_file": "demand.yaml", "state": {"url": "sqlite:///:memory:"}},
]
CONFIG_WORDS = vocabulary(*CONFIGS)


def configs() -> st.SearchStrategy[bytes]:
    docs = mutated(st.sampled_from(CONFIGS), CONFIG_WORDS, most=4)
    return docs.flatmap(file_bytes)


def config_target(hooks: AppHooks) -> Target:
    @contextmanager
    def world(folder: Path) -> Iterator[Check]:
        path = folder / "sco.yaml"

        def check(case: bytes, judge: Judge) -> None:
            path.write_bytes(case)
            judge.call(lambda: hooks.check_config(path), hooks.config_errors)

        yield check

    def command(case: bytes, folder: Path) -> list[str]:
        _write(folder / "sco.yaml", case)
        return ["config", "check", "sco.yaml"]

    return Target("config", configs(), world, weight=1.0, command=command)


# ---------------------------------------------------------------- the OpenStack region file

REGIONS: list[dict[str, Any]] = [
    {
        "region": "lab1",
        "image": "cirros",
        "network": "none",
        "headroom_ttl_s": 30,
        "pools": [
            {"hall": "hall-a", "flavor": "spot.small", "class": "spot", "price_per_h": 0.1},
            {"hall": "hall-a", "flavor": "std.small", "class": "guaranteed", "price_per_h": 0.3},
        ],
    },
    {
        "region": "r2",
        "image": "0b5e1c2a-7a43-4f7e-9d0e-5c2b8f9a1d3e",
        "network": "auto",
        "headroom_ttl_s": 15.5,
        "headroom_stale_s": 300,
        "api_timeout_s": 30,
        "rate_per_s": 20,
        "list_page_size": 50,
        "user_data_file": "user-data.sh",
        "pools": [
            {
                "hall": "hall-a",
                "flavor": "gpu.1",
                "class": "spot",
                "price_per_h": 1.2,
                "units_per_instance": 2,
                "aggregate": "agg-a",
                "availability_zone": "az-a",
                "notice_s": 120,
                "cold_start_s": 90,
            },
            {"hall": "hall-b", "flavor": "gpu.1", "class": "spot", "price_per_h": 1.1},
            {"hall": "hall-b", "flavor": "gpu.1g", "class": "guaranteed", "price_per_h": 3.0},
        ],
        "credential": {
            "openbao": {
                "url": "https://bao:8200",
                "path": "sco/openstack",
                "mount_point": "secret",
                "lease_s": 3600,
            }
        },
    },
]
REGION_WORDS = vocabulary(*REGIONS)
USER_DATA = b"#cloud-config\nruncmd: [echo hello]\n"


def regions() -> st.SearchStrategy[bytes]:
    return mutated(st.sampled_from(REGIONS), REGION_WORDS, most=4).flatmap(file_bytes)


def read_region(path: Path) -> None:
    """What `sco run`, `sco reclaim` and `sco slurm conf` do with a region file."""
    spec = load_region(path)
    spec.domain_pools()
    spec.spec_by_pool()


def region_target() -> Target:
    @contextmanager
    def world(folder: Path) -> Iterator[Check]:
        path = folder / "region.yaml"
        _write(folder / "user-data.sh", USER_DATA)

        def check(case: bytes, judge: Judge) -> None:
            path.write_bytes(case)
            judge.call(lambda: read_region(path), (RegionFileError,))

        yield check

    def command(case: bytes, folder: Path) -> list[str]:
        _write(folder / "region.yaml", case)
        _write(folder / "user-data.sh", USER_DATA)
        partition = {**SLURM_PARTITION, "slurm": {"partitions": ["batch"], "cpus": 2,
                                                  "memory_mb": 1000}}  # fmt: skip
        del partition["flavors"]
        config = {"provider": {"region_file": "region.yaml"}, "partitions": [partition]}
        _write(folder / "sco.yaml", dump_yaml(config))
        return ["slurm", "conf", "--config", "sco.yaml", "batch"]

    return Target("region", regions(), world, weight=1.0, command=command)


# ---------------------------------------------------------------- demand files


def _bundled_demand(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(bundled("demand", name).read_text())
    return doc


DEMANDS: list[dict[str, Any]] = [
    _bundled_demand("demo.yaml"),
    _bundled_demand("default.yaml"),
    {
        "partitions": [
            {
                "name": "web",
                "kind": "kubernetes",
                "flavors": ["p3.2xlarge"],
                "target_units": {"steps": [[0, 6], [86400, 8], [90000.5, 2]]},
                "floor_units": {"daily": {"08:00": 1, "20:00": 0}},
                "max_units": 12,
                "guaranteed_budget_units": 3,
            },
            {"name": "b.2", "kind": "slurm", "target_units": 0, "max_units": 0},
        ]
    },
]
DEMAND_WORDS = vocabulary(*DEMANDS)
DEMAND_TIMES_S = (0.0, 1.0, 34_200.0, 86_399.0, 90_000.5, 3e6)


def demands() -> st.SearchStrategy[bytes]:
    return mutated(st.sampled_from(DEMANDS), DEMAND_WORDS, most=4).flatmap(file_bytes)


def read_demand(path: Path, judge: Judge) -> None:
    """What a simulation and `sco run` do with a demand file: read it, then ask each
    partition's demand and the next change along the way."""
    specs = judge.call(lambda: read_demand_file(path, "r1"), (DemandFileError,))
    if specs is None:
        return
    start_s = 1000.0
    source = FileDemandSource(specs, start_s, str(path))
    for p in source.partitions():
        for t in DEMAND_TIMES_S:
            d = source.demand(p.name, start_s + t)
            judge.expect(
                0 <= d.floor_units <= d.max_units and 0 <= d.target_units <= d.max_units,
                f"demand within max_units: {d}",
            )
    for t in DEMAND_TIMES_S:
        nxt = source.next_change_after(start_s + t)
        judge.expect(nxt is None or nxt > start_s + t, f"a next change after now: {nxt}")


def demand_target() -> Target:
    @contextmanager
    def world(folder: Path) -> Iterator[Check]:
        path = folder / "demand.yaml"

        def check(case: bytes, judge: Judge) -> None:
            path.write_bytes(case)
            try:
                read_demand(path, judge)
            except Exception as e:  # from the demand of what was read: a crash too
                judge.call(_raiser(e), ())

        yield check

    def command(case: bytes, folder: Path) -> list[str]:
        _write(folder / "demand.yaml", case)
        traces = bundled("traces", "apache", "v100-4node")
        return ["simulate", "--traces", str(traces), "--demand", "demand.yaml",
                "--duration", "10m", "--json"]  # fmt: skip

    return Target("demand", demands(), world, weight=1.0, command=command)


def _raiser(e: BaseException) -> Callable[[], None]:
    def again() -> None:
        raise e

    return again


# ---------------------------------------------------------------- trace folders

TRACE_START = "2023-02-15 22:08:16"
SIM_REGIONS: list[dict[str, Any]] = [
    {},
    {"name": "v100", "flavor": "p3.2xlarge", "units_per_instance": 1, "halls": 3,
     "pool_size": 4, "guaranteed_price_per_h": 3.06, "guaranteed_quota_per_hall": 12,
     "spot_price_per_h": 0.9, "hall_of": {"zone-0": "hall-x"}},
]  # fmt: skip
TRACE_WORDS = [*vocabulary(*SIM_REGIONS), "metadata", "gap_seconds", "data"]


def _csv_rows(values: list[int], gap_s: int) -> list[list[Any]]:
    from datetime import datetime, timedelta

    t0 = datetime.fromisoformat(TRACE_START)
    return [["date", "availability"]] + [
        [str(t0 + timedelta(seconds=i * gap_s)), v] for i, v in enumerate(values)
    ]


def _csv_bytes(rows: Any) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows if isinstance(rows, list) else [rows]:
        writer.writerow(row if isinstance(row, list) else [row])
    return out.getvalue().encode("utf-8", "surrogatepass")


@st.composite
def trace_folders(draw: st.DrawFn) -> dict[str, bytes]:
    """A trace folder: 1-3 series as JSON or CSV (under `availability/` or not), at
    times with spot prices and a `region.yaml`, any of them spoilt."""
    files: dict[str, bytes] = {}
    names = [f"zone-{i}" for i in range(draw(st.integers(1, 3)))]
    lengths: dict[str, int] = {}
    for name in names:
        values = draw(st.lists(st.integers(0, 6), min_size=1, max_size=24))
        gap_s = draw(st.sampled_from([60, 195, 300]))
        lengths[name] = len(values)
        if draw(st.booleans()):
            doc: Any = {"metadata": {"gap_seconds": gap_s}, "data": values}
            files[f"{name}.json"] = draw(
                mutated(st.just(doc), TRACE_WORDS, most=2).flatmap(
                    lambda d: file_bytes(d, dump_json)
                )
            )
        else:
            rows = draw(mutated(st.just(_csv_rows(values, gap_s)), (), most=2))
            where = draw(st.sampled_from(["", "availability/"]))
            files[f"{where}{name}.csv"] = draw(file_bytes(rows, _csv_bytes))
    if draw(st.booleans()):
        prices = {n: [0.9 + 0.01 * i for i in range(k)] for n, k in lengths.items()}
        files["spot_prices.json"] = draw(
            mutated(st.just(prices), names, most=2).flatmap(lambda d: file_bytes(d, dump_json))
        )
    if draw(st.booleans()):
        region = draw(mutated(st.sampled_from(SIM_REGIONS), TRACE_WORDS, most=2))
        files["region.yaml"] = draw(file_bytes(region))
    return files


def write_folder(folder: Path, files: dict[str, bytes]) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, data in files.items():
        _write(folder / name, data)
    return folder


def read_traces(folder: Path, judge: Judge) -> None:
    """What `sco simulate --traces` does with a folder before it runs: load it, check
    it against the defaults, and build the simulated region."""
    traces = judge.call(lambda: load_traces(folder), (TraceError,))
    if traces is None:
        return
    for s in traces.series:
        ok = (
            len(s.times) == len(s.values) > 0
            and all(math.isfinite(t) for t in s.times)
            and all(b > a for a, b in zip(s.times, s.times[1:], strict=False))
            and all(type(v) is int and v >= 0 for v in s.values)
            and math.isfinite(s.tick_s)
            and s.tick_s > 0
        )
        judge.expect(ok, f"series {s.name}: finite, increasing times; counts >= 0")
        if s.prices is not None:
            judge.expect(
                len(s.prices) == len(s.values)
                and all(math.isfinite(p) and p >= 0 for p in s.prices),
                f"series {s.name}: a finite price >= 0 per row",
            )
    spec = SimulationSpec(traces=folder, demand=bundled("demand", "default.yaml"), duration_s=600.0)
    sim = judge.call(
        lambda: Simulation.build(spec),
        (TraceError, DemandFileError, SimulationInputError, UnknownPolicy),
    )
    if sim is None:
        return
    region = judge.call(lambda: SimRegion(traces, SimConfig(), start_s=sim.start_s), ())
    if region is not None:
        judge.call(lambda: (region.pools(), region.advance_to(sim.end_s)), ())


def traces_target() -> Target:
    @contextmanager
    def world(folder: Path) -> Iterator[Check]:
        def check(case: dict[str, bytes], judge: Judge) -> None:
            read_traces(write_folder(folder / "traces", case), judge)

        yield check

    def command(case: dict[str, bytes], folder: Path) -> list[str]:
        write_folder(folder / "traces", case)
        return ["simulate", "--traces", "traces", "--duration", "10m", "--json"]

    return Target("traces", trace_folders(), world, weight=1.0, command=command)
