"""The control plane's wiring without a cloud: the configuration file, signals read
from fleet state by every controller (and a restarted one), partitions independent in
time, the signal pump, `sco explain` and `sco handback`.

Controllers here run on the trace-driven simulated region; the same code runs on
OpenStack in `test_openstack_nova.py`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.common import bundled
from sco.assembly.settings import SettingsError, load
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.events import LifecycleEvent
from sco.domain.signals import Exclusion, ExclusionState, PoolScore
from sco.engine import builder
from sco.engine.clock import ManualClock, UuidIds
from sco.engine.cycle import CycleReport
from sco.engine.loops import PartitionLoops
from sco.engine.pump import PumpConfig, SignalPump
from sco.engine.replicas import ReplicaConfig, ReplicaRunner
from sco.engine.signals import FleetSignals
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.fakes import RecordingProvider
from sco_harness.runners import ports_of

# ---------------------------------------------------------------- sco config check


def sco(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


GOOD = {
    "state": {"url": "postgresql+psycopg://sco:db-secret-7f3a@db1:5432/sco"},
    "events": {
        "kind": "kafka",
        "kafka": {
            "brokers": "k1:9092",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "sco",
            "sasl_password": "kafka-secret-91c2",
        },
    },
    "history": {"url": "http://clickhouse:8123", "password": "ch-secret-44d0"},
    "leases": {"kind": "kubernetes", "kubernetes": {"namespace": "sco-system"}},
    "provider": {"cloud": "mycloud", "region_file": "region.yaml"},
    "partitions": [
        {
            "name": "batch",
            "kind": "slurm",
            "target_units": {"daily": {"08:00": 8, "20:00": 2}},
            "floor_units": 1,
            "max_units": 16,
        },
    ],
    "policy": {
        "interval_s": 10,
        "hedge": {"max_spare": 1},
        "controller": {"act": {"max_batch": 5}},
    },
}


def test_config_check_prints_the_resolved_file_with_secrets_masked(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "sco.yaml", GOOD)
    out = sco("config", "check", path)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert resolved["policy"]["hedge"]["max_spare"] == 1
    assert resolved["policy"]["hedge"]["cold_start_s"] == 120.0  # defaults filled in
    assert resolved["policy"]["controller"]["act"]["max_batch"] == 5
    assert resolved["provider"]["region_file"] == str(tmp_path / "region.yaml")  # file-relative
    assert resolved["leases"]["kubernetes"]["namespace"] == "sco-system"
    for secret in ("db-secret-7f3a", "kafka-secret-91c2", "ch-secret-44d0"):
        assert secret not in out.stdout
        assert secret not in out.stderr
    assert resolved["state"]["url"] == "postgresql+psycopg://sco:***@db1:5432/sco"


def test_environment_and_flags_override_the_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "sco.yaml", GOOD)
    env = dict(os.environ, SCO_POLICY__HEDGE__MAX_SPARE="3", SCO_LEASES__TTL_S="20")
    out = sco("config", "check", path, env=env)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert resolved["policy"]["hedge"]["max_spare"] == 3
    assert resolved["leases"]["ttl_s"] == 20.0
    os.environ["SCO_POLICY__INTERVAL_S"] = "7"
    try:
        settings = load(path, {"policy.interval_s": 2.0, "provider.cloud": None})
    finally:
        del os.environ["SCO_POLICY__INTERVAL_S"]
    assert settings.policy.interval_s == 2.0  # a flag beats the environment
    assert settings.provider.cloud == "mycloud"  # a flag not given changes nothing


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"statex": {}}, "statex: unknown field 'statex'; did you mean 'state'?"),
        ({"policy": {"hedge": {"max_spare": "many"}}}, "policy.hedge.max_spare:"),
        ({"policy": {"hedge": {"spare_risk": 0}}}, "spare_risk must be in (0, 1)"),
        ({"events": {"kind": "kafka"}}, "events: kind kafka needs a kafka section"),
        ({"leases": {"ttl_s": 1}}, "leases.ttl_s:"),
        (
            {
                "partitions": [
                    {
                        "name": "a",
                        "kind": "slurm",
                        "target_units": 2,
                        "floor_units": 9,
                        "max_units": 4,
                    }
                ]
            },
            "partitions[0].floor_units: floor 9 exceeds max_units 4",
        ),
        (
            {"partitions": [{"name": "a", "kind": "nomad", "target_units": 2, "max_units": 4}]},
            "partitions[0].kind:",
        ),
        ({"http": {"run_port": 70000}}, "http.run_port:"),
        (
            {
                "partitions": [
                    {"name": "w", "kind": "kubernetes", "demand": "kubernetes", "max_units": 4}
                ]
            },
            "demand kubernetes needs a kubernetes section (allocatable)",
        ),
        (
            {
                "partitions": [
                    {
                        "name": "w",
                        "kind": "kubernetes",
                        "demand": "kubernetes",
                        "max_units": 4,
                        "kubernetes": {"allocatable": {"cpu": "4"}},
                    }
                ]
            },
            "partitions[0].kubernetes.allocatable: needs memory",
        ),
        (
            {
                "partitions": [
                    {
                        "name": "w",
                        "kind": "kubernetes",
                        "demand": "kubernetes",
                        "max_units": 4,
                        "kubernetes": {
                            "cluster": "east",
                            "allocatable": {"cpu": "4", "memory": "8Gi"},
                        },
                    }
                ],
                "kubernetes": {"west": {}},
            },
            "partitions.w.kubernetes.cluster: 'east' is not in the kubernetes section (west)",
        ),
        (
            {"kubernetes": {"a": {"in_cluster": True, "kubeconfig": "k"}}},
            "give kubeconfig or in_cluster, not both",
        ),
    ],
)
def test_config_check_names_the_field(tmp_path: Path, doc: dict[str, object], message: str) -> None:
    path = write_yaml(tmp_path / "sco.yaml", doc)
    out = sco("config", "check", path)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr, out.stderr
    assert str(path) in out.stderr
    assert "Traceback" not in out.stderr


def test_config_migrate_brings_the_schema_up_and_names_an_unreachable_database(
    tmp_path: Path,
) -> None:
    path = write_yaml(tmp_path / "sco.yaml", {"state": {"url": "sqlite:///state.sqlite"}})
    out = sco("config", "migrate", "--config", path)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r".*state\.sqlite: schema at revision \w+", out.stdout.strip())
    assert (tmp_path / "state.sqlite").exists()
    again = sco("config", "migrate", "--config", path)  # nothing to do: the same answer
    assert again.stdout == out.stdout
    dead = write_yaml(tmp_path / "dead.yaml", {"state": {
        "url": "postgresql+psycopg://sco:pw@127.0.0.1:1/sco?connect_timeout=2"}})  # fmt: skip
    out = sco("config", "migrate", "--config", dead)
    assert out.returncode == 2, out.stderr
    assert "state.url: cannot reach the database" in out.stderr
    assert "pw" not in out.stderr


def test_processes_started_together_on_a_new_sqlite_file_migrate_it_once(
    tmp_path: Path,
) -> None:
    """`sco run`, `sco watch` and `sco history load` started at once on a fresh file:
    each migrated as if alone, and all but one failed with "table alembic_version
    already exists" (issue 28). One takes SQLite's write lock, the others wait."""
    n = 4
    code = (
        "import pathlib, sys, time\n"
        "from sco.adapters.sqlstate.store import SqlFleetStore\n"
        "here = pathlib.Path(sys.argv[1])\n"
        "(here / f'ready-{sys.argv[2]}').touch()\n"
        f"while len(list(here.glob('ready-*'))) < {n}:\n"
        "    time.sleep(0.001)\n"  # all imported: they open the file at the same moment
        "print(SqlFleetStore(f'sqlite:///{here}/state.sqlite').schema_revision())\n"
    )
    for trial in range(3):
        here = tmp_path / str(trial)
        here.mkdir()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(here), str(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * n, [err[-400:] for _, err in outs]
        assert len({out for out, _ in outs}) == 1  # the same revision, whoever migrated


def test_config_errors_from_the_environment_name_the_variable(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "sco.yaml", {})
    out = sco("config", "check", path, env=dict(os.environ, SCO_POLICY__INTERVAL_S="soon"))
    assert out.returncode == 2
    assert "SCO_POLICY__INTERVAL_S (environment): policy.interval_s:" in out.stderr


def test_config_file_that_is_not_there_or_not_yaml(tmp_path: Path) -> None:
    out = sco("config", "check", tmp_path / "nope.yaml")
    assert out.returncode == 2
    assert "nope.yaml: no such file" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("state: [unclosed\n")
    out = sco("config", "check", bad)
    assert out.returncode == 2
    assert "not YAML" in out.stderr
    bad.write_text("- a list\n")
    with pytest.raises(SettingsError, match="must be a mapping"):
        load(bad)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0:\n  00:00: 3\n", "section 0 is not a name"),
        ("2024-01-01: x\n", "section 2024-01-01 is not a name"),
        ("state:\n  1: x\n", r"state\[1\]: Keys should be strings"),
        (b"\xff\xfe: 1\n", "not UTF-8 text"),
        ("[" * 3000 + "]" * 3000, "not YAML"),
        ("a: !!float ''\n", "not YAML"),
    ],
)
def test_config_files_fuzzing_found(tmp_path: Path, text: str | bytes, said: str) -> None:
    """Regressions from bench/fuzz.py (issue 17): a top-level key YAML reads as a
    number or a date was a TypeError ("keywords must be strings") and a traceback;
    bytes that are not UTF-8, nesting past the parser's recursion and a malformed
    scalar were tracebacks too. Each is now one line and exit status 2."""
    bad = tmp_path / "sco.yaml"
    if isinstance(text, bytes):
        bad.write_bytes(text)
    else:
        bad.write_text(text)
    out = sco("config", "check", bad)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert re.search(said, out.stderr), out.stderr
    assert out.stderr.startswith("sco: error: ")


# ---------------------------------------------------------------- a simulated region


class World:
    """A simulated region of three spot pools and a guaranteed hall, two partitions,
    fleet state in `url`, on a manual clock."""

    def __init__(self, tmp: Path, url: str, partitions: int = 2) -> None:
        traces = tmp / "traces"
        for zone in ("a", "b", "c"):
            write_json_trace(traces, zone, [6] * 60, gap_s=600)
        write_yaml(traces / "region.yaml", {"halls": 3, "guaranteed_quota_per_hall": 10})
        demand = write_yaml(
            tmp / "demand.yaml",
            {
                "partitions": [
                    {"name": f"p{i}", "kind": "slurm", "target_units": 3, "max_units": 4}
                    for i in range(partitions)
                ]
            },
        )
        self.region = SimRegion(load_traces(traces), SimConfig(cold_start_s=10.0))
        self.clock = ManualClock(0.0)
        self.url = url
        self.demand = FileDemandSource.load(demand, "traces", 0.0)
        self.pools = [p for p in self.region.pools() if p.is_spot]
        self.stores: dict[str, SqlFleetStore] = {}  # each replica's own connection

    def replica(self, name: str) -> ReplicaRunner:
        """A new process: its own connection, nothing in memory."""
        store = self.stores[name] = SqlFleetStore(self.url)
        ports = ports_of(
            self.region, self.region, store, self.demand, self.clock, leases=SqlLeases(store.engine)
        )
        return builder.replica(
            ports,
            ReplicaConfig(name, lease_ttl_s=15, lease_every_s=1, act_margin_s=5),
            lambda: ScoPolicy(HedgeConfig(max_spare=0)),
            5,
        )

    def step(self, dt: float, replicas: list[ReplicaRunner]) -> None:
        for _ in range(int(dt)):
            t = self.clock.now() + 1
            self.region.advance_to(t)
            self.clock.set(t)
            for r in replicas:
                r.tend_leases()
                if int(t) % 5 == 0:
                    for name in list(r.controllers):
                        r.cycle_once(name)


def exclude(store: SqlFleetStore, pool: str, now: float, until: float) -> Exclusion:
    ex = Exclusion(pool, ExclusionState.EXCLUDED, now, until, until - now, now, "test: bad pool")
    return store.put_exclusion(ex, LifecycleEvent(f"x:{pool}", now, "", pool, None, "excluded", ""))


def test_replicas_and_a_restarted_replica_act_on_the_same_exclusion(
    tmp_path: Path, fleet_url: str
) -> None:
    w = World(tmp_path, fleet_url, partitions=4)
    r1, r2 = w.replica("r1"), w.replica("r2")
    w.step(60, [r1, r2])
    assert len(r1.held) == 2
    assert len(r2.held) == 2
    bad = w.pools[0].id
    exclude(
        w.stores[r1.config.name], bad, w.clock.now(), w.clock.now() + 3600
    )  # the watcher's word
    w.step(10, [r1, r2])
    for r in (r1, r2):
        for name in r.held:
            plan = w.stores[r.config.name].latest_plan(name)
            assert plan is not None
            assert "excluded" in plan.pools[bad].flags, (r.config.name, name)
            assert plan.spot.get(bad, 0) <= plan.pools[bad].held  # nothing new goes there
    # r1 dies; its partitions go to a fresh process that has never seen the exclusion
    # in memory: it reads it from fleet state and plans around it too.
    w.step(20, [r2])
    r3 = w.replica("r3")
    w.step(40, [r2, r3])
    assert r3.held, "the new replica leads partitions"
    before = {name: w.region.held_in(bad) for name in r3.held}
    for name in r3.held:
        plan = w.stores[r3.config.name].latest_plan(name)
        assert plan is not None
        assert "excluded" in plan.pools[bad].flags
    assert w.region.held_in(bad) <= max(before.values())


def test_recent_reclaims_of_every_partition_reach_every_controller(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    w = World(tmp_path, url, partitions=2)
    store = SqlFleetStore(url)
    store.upsert_pools(w.region.pools())
    signals = [FleetSignals(store, store, w.region.pools()) for _ in range(2)]  # two processes
    mine, other = signals
    pool = w.pools[1].id
    mine.note_reclaim(pool, "inst-1", 100.0)  # seen by this process's controller
    mine.note_reclaim(pool, "inst-1", 100.0)  # noticed, then vanished: one reclaim
    assert mine.recent_reclaims(pool, 100.0) == 1
    assert other.recent_reclaims(pool, 100.0) == 0
    from sco.domain.instances import created, step
    from sco.domain.lifecycle import State, Trigger
    from sco_harness.builders import instance

    rec = instance(w.pools[1], State.READY, partition_name="p0")
    store.record([created(rec, "adopted")])
    store.record([step(rec, Trigger.SERVER_VANISHED, 120.0, "gone")])
    other.refresh(130.0)
    assert other.recent_reclaims(pool, 130.0) == 1
    assert other.last_reclaim(pool) == 120.0
    assert other.recent_reclaims(pool, 120.0 + 3601) == 0  # out of the hour
    store.close()


# ---------------------------------------------------------------- independent in time


def test_a_blocked_create_holds_up_only_its_own_partition(tmp_path: Path) -> None:
    """Partition p0's create blocks (as Nova's scheduler can for a minute); p1 keeps
    cycling on its own schedule meanwhile, and p0 carries on once it returns."""
    url = sqlite_url(tmp_path / "state.db")
    w = World(tmp_path, url)
    provider = RecordingProvider(w.region)
    provider.block_creates("p0")
    store = SqlFleetStore(url)
    store.upsert_pools(w.region.pools())
    cycles: dict[str, int] = {"p0": 0, "p1": 0}
    lock = threading.Lock()

    def on_report(report: CycleReport) -> None:
        with lock:
            cycles[report.partition] += 1

    loops = PartitionLoops(0.02, on_report=on_report)
    ports = ports_of(provider, w.region, store, w.demand, w.clock, ids=UuidIds())
    for controller in builder.controllers(ports, lambda: ScoPolicy(HedgeConfig(max_spare=0))):
        loops.start(controller.partition.name, controller)
    try:
        assert provider.wait_blocked("p0", timeout_s=30), "p0's create never started"
        deadline = time.monotonic() + 60
        while cycles["p1"] < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cycles["p1"] >= 20, cycles
        assert cycles["p0"] == 0, "p0 is still inside its first cycle's create"
        provider.release("p0")
        while cycles["p0"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cycles["p0"] >= 3, cycles
    finally:
        provider.release("p0")
        loops.stop_all(wait_s=10)
        store.close()
    creates = [c for c in provider.calls if c[0] == "create"]
    assert {c[1] for c in creates} == {"p0", "p1"}


# ---------------------------------------------------------------- the signal pump


def test_pump_relays_the_outbox_and_wakes_on_new_signals(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    w = World(tmp_path, url)
    store = SqlFleetStore(url)
    store.upsert_pools(w.region.pools())
    log = SqlEventLog(store.engine)
    woken: list[int] = []
    pump = SignalPump(
        outbox=store,
        signals=store,
        provider=w.region,
        pools=w.region.pools(),
        relay=log.absorb_outbox,
        clock=w.clock,
        on_signals=lambda: woken.append(1),
        config=PumpConfig(relay_every_s=0, ages_every_s=0, headroom_every_s=0, stamp_every_s=0),
    )
    pump.step()  # ages written, headroom sampled and relayed, the stamp seen first
    assert store.pool_ages()[w.pools[0].id] == 0.0
    relayed = log.read("t", 100)
    assert len(relayed) == len(w.pools)  # one headroom sample per spot pool
    pump.step()
    assert not woken
    store.save_scores(
        [
            PoolScore(
                pool=w.pools[0].id, generation=0, computed_at=1.0, hazard_per_h=0.1,
                exposure_h=1.0, reclaims=0, survival=0.9, success_ratio=1.0, attempts=1,
                ready_p50_s=None, ready_n=0, headroom=None, headroom_n=0, value=0.9, why="",
            )
        ]
    )  # fmt: skip
    pump.step()
    assert not woken  # new scores wait for each partition's next cycle
    exclude(store, w.pools[0].id, 5.0, 600.0)
    pump.step()
    assert woken == [1]
    store.put_intent("p1", "handback", 10.0, "test")
    pump.step()
    assert woken == [1, 1]
    assert store.outbox_size() == 0  # the exclusion's event relayed too
    # Replicas sampling the same period emit the same sample: one event id per pool
    # and period, which the log (and history) keep once.
    log.read("t", 100)  # what came before
    for _ in range(2):
        SignalPump(
            outbox=store,
            signals=store,
            provider=w.region,
            pools=w.region.pools(),
            relay=log.absorb_outbox,
            clock=w.clock,
            on_signals=lambda: None,
            config=PumpConfig(relay_every_s=0, ages_every_s=0, headroom_every_s=1800),
        ).step()
    assert len(log.read("t", 100)) == len(w.pools)
    store.close()


# ---------------------------------------------------------------- explain and handback


def test_explain_prints_the_plan_pool_by_pool(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    out = sco(
        "simulate",
        "--traces",
        bundled("traces", "apache", "v100-9zone"),
        "--demand",
        bundled("demand", "demo.yaml"),
        "--duration",
        "6h",
        "--state",
        state,
    )
    assert out.returncode == 0, out.stderr
    out = sco("explain", "--state", state, "k8s-service")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "k8s-service: plan generation" in text
    assert "guaranteed" in text
    assert "age" in text  # a hazard term, per pool
    assert "holds:" in text
    out = sco("explain", "--state", state, "k8s-service", "--json")
    doc = json.loads(out.stdout)
    assert doc["generation"] >= 1
    spot = {p: why for p, why in doc["pools"].items() if why["terms"]}
    assert spot, "spot pools carry their terms"
    for why in spot.values():
        assert {
            "age",
            "recent_reclaims",
            "full_pool",
            "storm",
            "price",
            "crowding",
            "stickiness",
        } <= set(why["terms"])
    for pool, n in doc["spot"].items():
        assert doc["pools"][pool]["target"] == n
    assert {"cold_start_s", "notice_s", "spare", "floor_need_units"} <= set(doc["terms"])
    out = sco("explain", "--state", state, "nope")
    assert out.returncode == 2
    assert "no plan for partition 'nope'" in out.stderr


def test_handback_drains_everything_and_cancel_takes_it_back(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    w = World(tmp_path, url, partitions=2)
    r = w.replica("solo")
    w.step(60, [r])
    assert len(w.stores[r.config.name].instances("p0")) >= 3
    out = sco("handback", "--state", tmp_path / "state.db", "p0", "--no-wait")
    assert out.returncode == 0, out.stderr
    w.step(120, [r])  # drains (30 s), then deletes
    assert w.stores[r.config.name].instances("p0") == []
    assert len(w.stores[r.config.name].instances("p1")) >= 3, "the other partition is untouched"
    plan = w.stores[r.config.name].latest_plan("p0")
    assert plan is not None
    assert plan.targets() == {}
    reasons = {h.trigger for h in w.stores[r.config.name].history() if h.partition == "p0"}
    assert "drain_requested" in reasons
    w.step(30, [r])
    assert w.stores[r.config.name].instances("p0") == [], "nothing comes back while handed back"
    out = sco("handback", "--state", tmp_path / "state.db", "p0", "--cancel")
    assert out.returncode == 0, out.stderr
    assert "back in service" in out.stdout
    w.step(60, [r])
    assert len(w.stores[r.config.name].instances("p0")) >= 3


def test_score_writes_a_generation_and_fails_when_history_is_unreachable(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    history = f"chdb://{tmp_path / 'history'}"
    out = sco(
        "simulate",
        "--traces",
        bundled("traces", "apache", "v100-4node"),
        "--duration",
        "12h",
        "--state",
        state,
        "--history",
        history,
    )
    assert out.returncode == 0, out.stderr
    before = SqlFleetStore(sqlite_url(state)).signal_stamp()[1]
    out = sco("score", "--state", state, "--history", history)
    assert out.returncode == 0, out.stderr
    assert f"score generation {before + 1}:" in out.stderr
    assert SqlFleetStore(sqlite_url(state)).signal_stamp()[1] == before + 1
    out = sco("score", "--state", state, "--history", "http://127.0.0.1:9")
    assert out.returncode == 2
    assert "history.url" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_new_exclusion_is_read_at_once_when_the_pump_says_so(tmp_path: Path) -> None:
    """Controllers of a process share one refresh every `refresh_s`; when the pump sees
    an exclusion land it invalidates that, so the cycles it wakes plan with it."""
    url = sqlite_url(tmp_path / "state.db")
    w = World(tmp_path, url)
    store = SqlFleetStore(url)
    store.upsert_pools(w.region.pools())
    signals = FleetSignals(store, store, w.region.pools(), refresh_s=10.0)
    pool = w.pools[0].id
    signals.refresh(100.0)
    exclude(store, pool, 100.5, 900.0)
    signals.refresh(101.0)
    assert signals.state(pool, 101.0) is None  # within refresh_s: the cached view
    signals.invalidate()
    signals.refresh(101.0)
    assert signals.state(pool, 101.0) is ExclusionState.EXCLUDED
    store.close()
