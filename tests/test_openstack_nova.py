"""The controller against a real Nova (fake virt driver) and real Placement.

The stack (nova-api, conductor, scheduler, four nova-computes, Placement,
Glance, Neutron, MariaDB, RabbitMQ) is started by `scripts/openstack/nova.sh`.
Two halls, each a host aggregate and availability zone of two computes; each
compute offers 4 `CUSTOM_SPOT_SLOT`s (spot) and 8 vCPUs (guaranteed shares
them). A "reclaimer" here is the test deleting spot servers, or setting the
reclaim-notice metadata, as an operator's tooling would.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.openstack import CloudsYamlSecrets, open_provider
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.provider import OpenStackProvider
from sco.adapters.openstack.resources import (
    META_RECLAIM_AT,
    QuotaRoom,
    partition_tag,
)
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.adapters.standalone import ServersAsNodes
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy, policy_named
from sco.domain.lifecycle import State
from sco.engine.clock import SystemClock
from sco.engine.cycle import ControllerConfig
from sco_harness.controlplane import (
    wait_for,
)
from sco_harness.fakes import RecordingProvider
from sco_harness.openstack_stack import ROOT, NovaStack, echo, region_spec
from sco_harness.runners import Rounds, ports_of, rounds_of

CLOUD = "sco-test"
MICROVERSION = "2.90"
REGION = region_spec(["hall-a", "hall-b"])  # the shared stack's halls (conftest)


@dataclass
class Cloud:
    folder: Path
    region_file: Path
    stack: NovaStack

    @property
    def clouds_yaml(self) -> Path:
        return self.stack.clouds_yaml

    @property
    def conn(self) -> Any:
        return self.stack.conn

    def servers(self, **params: str) -> list[dict[str, Any]]:
        r = self.conn.compute.get("/servers/detail", params=params, microversion=MICROVERSION)
        assert r.status_code == 200, r.text
        return [s for s in r.json()["servers"] if s.get("OS-EXT-STS:task_state") != "deleting"]

    def of(self, partition: str) -> list[dict[str, Any]]:
        return self.servers(tags=partition_tag(partition))

    def delete(self, server_id: str) -> None:
        r = self.conn.compute.delete(f"/servers/{server_id}", microversion=MICROVERSION)
        assert r.status_code in (204, 404), r.text

    def notice(self, server_id: str, deadline: float) -> None:
        r = self.conn.compute.put(
            f"/servers/{server_id}/metadata/{META_RECLAIM_AT}",
            json={"meta": {META_RECLAIM_AT: str(deadline)}},
            microversion=MICROVERSION,
        )
        assert r.status_code == 200, r.text

    def clear(self) -> None:
        self.stack.clear()


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory, stack: NovaStack) -> Iterator[Cloud]:
    folder = tmp_path_factory.mktemp("nova-tier")
    old = os.environ.get("OS_CLIENT_CONFIG_FILE")
    try:
        os.environ["OS_CLIENT_CONFIG_FILE"] = str(stack.clouds_yaml)  # for _provider()
        region_file = folder / "region.yaml"
        region_file.write_text(yaml.safe_dump(REGION))
        yield Cloud(folder, region_file, stack)
    finally:
        if old is None:
            os.environ.pop("OS_CLIENT_CONFIG_FILE", None)
        else:
            os.environ["OS_CLIENT_CONFIG_FILE"] = old


@pytest.fixture
def clean(cloud: Cloud) -> Iterator[Cloud]:
    yield cloud
    cloud.clear()


def _provider() -> OpenStackProvider:
    region = RegionSpec.model_validate(REGION)
    provider = open_provider(region, CLOUD, CloudsYamlSecrets(), SystemClock())
    provider.discover()
    provider.refresh()
    return provider


SPOT_A = "lab/hall-a/spot.small"
SPOT_B = "lab/hall-b/spot.small"
STD_A = "lab/hall-a/std.small"


# ---------------------------------------------------------------- provider


def test_headroom_and_quota_from_the_cloud(clean: Cloud) -> None:
    provider = _provider()
    cache = provider.refresh()
    # 2 computes x 4 slots; guaranteed: 2 computes x 2 vCPU x ratio 4.0
    assert cache.rooms == {
        SPOT_A: 8,
        SPOT_B: 8,
        STD_A: 16,
        "lab/hall-b/std.small": 16,
    }
    assert cache.calls == 3  # a call per flavor and the limits; membership is kept
    assert cache.quota == QuotaRoom(None, None, None)  # the stack sets no quota
    echo(f"headroom refresh on the nova stack: {cache.took_s * 1000:.0f} ms")


def test_create_returns_before_the_scheduler_and_refusals_are_listed(clean: Cloud) -> None:
    provider = _provider()
    # Nova places all of a multi-create or none: 12 into a pool of 8 are all refused.
    result = provider.create(SPOT_B, 12, "req-split", "split", 1)
    assert (result.server_ids, result.pending) == ((), 12)
    refused = wait_for(
        lambda: (v := provider.list("split")) and len(v) == 12 and all(x.refused for x in v) and v,
        120,
        "12 refused",
    )
    assert all("No valid host" in v.fault for v in refused)
    provider.delete([v.server_id for v in refused])
    ok = provider.create(SPOT_B, 8, "req-fits", "split", 1)
    assert ok.pending == 8
    servers = wait_for(
        lambda: (
            (s := clean.of("split"))
            and len(s) == 8
            and all(x["status"] == "ACTIVE" for x in s)
            and s
        ),
        120,
        "8 ACTIVE",
    )
    assert {s["OS-EXT-AZ:availability_zone"] for s in servers} == {"hall-b"}
    # the same request id again creates nothing new
    again = provider.create(SPOT_B, 8, "req-fits", "split", 1)
    assert sorted(again.server_ids) == sorted(s["id"] for s in servers)
    assert len(clean.of("split")) == 8


class _Overstated(RecordingProvider):
    """Headroom as a stale cache would state it: more than the scheduler can place
    (until `honest`)."""

    honest = False

    def headroom(self, pools: Any) -> Any:
        if self.honest:
            return super().headroom(pools)
        return {p: (12 if p == SPOT_B else 0) for p in pools}


def test_controller_shrinks_batches_the_scheduler_refuses(clean: Cloud, tmp_path: Path) -> None:
    provider = _provider()
    overstated = _Overstated(provider)
    state = tmp_path / "state.sqlite"
    clock = SystemClock()
    ports = ports_of(
        overstated,  # type: ignore[arg-type]
        ServersAsNodes(provider.last_listing),
        SqlFleetStore(sqlite_url(state)),
        FileDemandSource.load(_demand(tmp_path, "shrink", 12), "lab", clock.now()),
        clock,
    )
    runner = rounds_of(
        ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)), ControllerConfig(list_grace_s=5.0)
    )
    _until(runner, provider, lambda: len(_ready(runner, "shrink")) >= 8, 180, "8 ready")
    overstated.honest = True  # the cache catches up: what was refused goes, nothing new
    for _ in range(10):
        provider.refresh()
        runner.round()
        time.sleep(0.5)
    servers = clean.of("shrink")
    in_b = [s for s in servers if s["OS-EXT-AZ:availability_zone"] == "hall-b"]
    assert len([s for s in in_b if s["status"] == "ACTIVE"]) == 8
    history = runner.store.history()
    refusals = [r for r in history if r.trigger == "create_failed"]
    assert refusals, "the scheduler's refusals are recorded as refused creates"
    assert all("No valid host" in r.reason for r in refusals)
    wait_for(
        lambda: not [s for s in clean.of("shrink") if s["status"] == "ERROR"],
        60,
        "refused servers deleted",
    )
    echo(f"refused and shrunk: {len(refusals)} refused creates on the way to 8")


# ---------------------------------------------------------------- controller


def _demand(folder: Path, name: str, target: int) -> Path:
    path = folder / f"demand-{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "partitions": [
                    {
                        "name": name,
                        "kind": "slurm",
                        "target_units": target,
                        "floor_units": 0,
                        "max_units": target + 2,
                    }
                ]
            }
        )
    )
    return path


def _runner(provider: OpenStackProvider, state: Path, demand: Path) -> Rounds:
    clock = SystemClock()
    ports = ports_of(
        provider,
        ServersAsNodes(provider.last_listing),
        SqlFleetStore(sqlite_url(state)),
        FileDemandSource.load(demand, "lab", clock.now()),
        clock,
    )
    return rounds_of(
        ports, lambda: policy_named("sco"), ControllerConfig(list_grace_s=5.0), provider.degraded
    )


def _ready(runner: Rounds, partition: str) -> list[Any]:
    return [i for i in runner.store.instances(partition) if i.state is State.READY and i.is_spot]


def _until(
    runner: Rounds,
    provider: OpenStackProvider,
    done: Callable[[], bool],
    timeout: float,
    what: str,
) -> int:
    deadline = time.monotonic() + timeout
    rounds = 0
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {rounds} rounds")
        provider.refresh()
        runner.round()
        rounds += 1
        time.sleep(1.0)
    return rounds


def test_controller_fills_two_halls_and_replaces_reclaims(clean: Cloud, tmp_path: Path) -> None:
    provider = _provider()
    runner = _runner(provider, tmp_path / "state.sqlite", _demand(tmp_path, "batch", 6))
    t0 = time.monotonic()
    _until(runner, provider, lambda: len(_ready(runner, "batch")) >= 6, 180, "6 ready")
    fill_s = time.monotonic() - t0
    servers = clean.of("batch")
    for s in servers:
        assert s["metadata"]["sco:partition"] == "batch"
        assert s["metadata"]["sco:request"]
    # The policy may hold a guaranteed spare; the six ready units are spot.
    spot = [s for s in servers if s["metadata"]["sco:class"] == "spot"]
    assert len(spot) >= 6
    zones = {s["OS-EXT-AZ:availability_zone"] for s in spot}
    assert zones == {"hall-a", "hall-b"}, "spread across both halls"
    servers = spot

    # Reclaim without notice: two spot servers vanish.
    gone = [s["id"] for s in servers[:2]]
    for sid in gone:
        clean.delete(sid)
    t1 = time.monotonic()
    _until(
        runner,
        provider,
        lambda: (
            len(_ready(runner, "batch")) >= 6
            and not {i.server_id for i in _ready(runner, "batch")} & set(gone)
        ),
        180,
        "replaced after a reclaim",
    )
    replace_s = time.monotonic() - t1
    history = runner.store.history()
    vanished = {r.instance_id for r in history if r.trigger == "server_vanished"}
    assert len(vanished) == 2

    # Reclaim with notice: the noticed server is drained, replaced and deleted by sco.
    target = _ready(runner, "batch")[0]
    assert target.server_id is not None
    clean.notice(target.server_id, time.time() + 120)
    _until(
        runner,
        provider,
        lambda: (
            target.server_id not in {s["id"] for s in clean.of("batch")}
            and runner.store.history(target.id)[-1].to_state == "gone"
            and len(_ready(runner, "batch")) >= 6
        ),
        180,
        "noticed server replaced and deleted",
    )
    states = [r.to_state for r in runner.store.history(target.id)]
    assert "noticed" in states, states
    assert states[-1] == "gone", states
    assert not any(s["status"] == "ERROR" for s in clean.of("batch"))
    echo(f"nova tier: 6 ready in {fill_s:.1f} s, 2 reclaims replaced in {replace_s:.1f} s")


def test_no_churn_a_reclaim_is_replaced_on_spot_and_nothing_else_moves(
    clean: Cloud, tmp_path: Path
) -> None:
    """Target 3, floor 2: the partition fills on spot and stays put (no server created
    and then drained while nothing changed); after a reclaim it returns to its target on
    spot within a few cycles, without buying guaranteed capacity."""
    provider = _provider()
    demand = tmp_path / "demand.yaml"
    demand.write_text(
        yaml.safe_dump(
            {
                "partitions": [
                    {
                        "name": "calm",
                        "kind": "kubernetes",
                        "target_units": 3,
                        "floor_units": 2,
                        "max_units": 6,
                    }
                ]
            }
        )
    )
    runner = _runner(provider, tmp_path / "state.sqlite", demand)
    _until(runner, provider, lambda: len(_ready(runner, "calm")) >= 3, 180, "3 ready")
    for _ in range(8):  # nothing changes in the world
        provider.refresh()
        runner.round()
        time.sleep(0.5)

    def live() -> list[Any]:
        return [i for i in runner.store.instances("calm") if i.is_live]

    history = runner.store.history()
    assert not [r for r in history if r.to_state == "draining"], "nothing created then drained"
    assert all(i.is_spot for i in live()), "no guaranteed server while spot holds"
    assert len(live()) == 3
    victim = _ready(runner, "calm")[0]
    assert victim.server_id is not None
    clean.delete(victim.server_id)
    cycles = _until(
        runner,
        provider,
        lambda: len(_ready(runner, "calm")) >= 3 and victim.id not in {i.id for i in live()},
        180,
        "the reclaim replaced",
    )
    for _ in range(5):
        provider.refresh()
        runner.round()
        time.sleep(0.5)
    assert len(live()) == 3, [(i.pool, i.state) for i in live()]
    assert all(i.is_spot for i in live()), "back on spot, no guaranteed server kept"
    guaranteed = [r for r in runner.store.history() if "std.small" in r.pool]
    assert not guaranteed, "no guaranteed capacity bought for a reclaim the margin absorbs"
    echo(f"no churn: reclaim replaced on spot in {cycles} rounds")


# ---------------------------------------------------------------- sco run, killed mid-create


def _sco(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _run_args(cloud: Cloud, demand: Path, state: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--cloud",
        CLOUD,
        "--region",
        str(cloud.region_file),
        "--demand",
        str(demand),
        "--state",
        str(state),
        "--interval",
        "1s",
        "--metrics-port",
        "0",  # none unless a test asks (several replicas on one host)
        *extra,
    ]


def test_kill_mid_create_then_restart_creates_nothing_twice(clean: Cloud, tmp_path: Path) -> None:
    env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(clean.clouds_yaml))
    demand = _demand(tmp_path, "svc", 10)
    state = tmp_path / "state.sqlite"
    first = _sco(*_run_args(clean, demand, state), env=env)
    try:
        # Killed while its first creates are being scheduled.
        wait_for(lambda: clean.of("svc") or first.poll() is not None, 120, "a first server")
        assert first.poll() is None, first.communicate()[1][-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    before = {s["id"] for s in clean.of("svc")}
    # Records of creates the first never sent are closed after the listing grace:
    # shortened here (through the environment, as any setting) to fit 40 cycles.
    env["SCO_POLICY__CONTROLLER__LIST_GRACE_S"] = "10"
    second = _sco(*_run_args(clean, demand, state, "--cycles", "40"), env=env)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    servers = clean.of("svc")
    ids = {s["id"] for s in servers}
    assert before <= ids, "servers created before the kill were adopted, not replaced"
    with sqlite3.connect(state) as db:
        live = dict(
            db.execute(
                "SELECT server_id, request_id FROM instances "
                "WHERE state NOT IN ('gone', 'failed') AND server_id IS NOT NULL"
            ).fetchall()
        )
        per_request = dict(
            db.execute("SELECT request_id, COUNT(*) FROM instances GROUP BY request_id").fetchall()
        )
    assert ids == set(live), "every server has a live record and every record a server"
    by_request: dict[str, int] = {}
    for s in servers:
        rid = s["metadata"]["sco:request"]
        by_request[rid] = by_request.get(rid, 0) + 1
    for rid, n in by_request.items():
        assert n <= per_request.get(rid, 0), f"request {rid} has {n} servers"
    assert not [s for s in servers if s["status"] == "ERROR"]
    ready = sum(1 for s in servers if s["status"] == "ACTIVE")
    assert ready >= 10
    echo(f"kill mid-create: {len(before)} servers at the kill, {len(ids)} after restart")


# ---------------------------------------------------------------- bad input and outages


def test_start_errors_exit_2_naming_the_problem(cloud: Cloud, tmp_path: Path) -> None:
    env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(cloud.clouds_yaml))
    demand = _demand(tmp_path, "x", 1)
    state = tmp_path / "state.sqlite"

    def run(*args: str, env: dict[str, str] = env) -> tuple[int, str]:
        p = _sco(*args, env=env)
        _, err = p.communicate(timeout=120)
        return p.returncode, err

    code, err = run(
        *_run_args(cloud, demand, state)[:2], "nope", *_run_args(cloud, demand, state)[3:]
    )
    assert code == 2, err
    assert "'nope' is not in clouds.yaml" in err, err

    bad = dict(
        REGION, pools=[{"hall": "hall-c", "flavor": "huge", "class": "spot", "price_per_h": 1}]
    )
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(bad))
    args = _run_args(cloud, demand, state)
    args[args.index("--region") + 1] = str(bad_file)
    code, err = run(*args)
    assert code == 2, err
    assert "flavor 'huge'" in err, err
    assert "aggregate 'hall-c'" in err, err

    clouds = yaml.safe_load(cloud.clouds_yaml.read_text())
    down = json.loads(json.dumps(clouds["clouds"][CLOUD]))
    down["compute_endpoint_override"] = "http://127.0.0.1:9/v2.1"
    down["auth"]["endpoint"] = "http://127.0.0.1:9/v2.1"
    refused = dict(clouds["clouds"][CLOUD])
    refused["auth"] = dict(refused["auth"], token="invalid-token-canary")
    clouds["clouds"]["sco-down"] = down
    clouds["clouds"]["sco-refused"] = refused
    other = tmp_path / "clouds.yaml"
    other.write_text(yaml.safe_dump(clouds))
    env2 = dict(env, OS_CLIENT_CONFIG_FILE=str(other))
    args = _run_args(cloud, demand, state)
    args[args.index("--cloud") + 1] = "sco-down"
    code, err = run(*args, env=env2)
    assert code == 2, err
    assert "sco-down" in err, err
    assert "endpoint unreachable" in err, err
    args[args.index("--cloud") + 1] = "sco-refused"
    code, err = run(*args, env=env2)
    assert code == 2, err
    assert "credential was refused" in err, err
    assert "canary" not in err

    args = _run_args(cloud, demand, state)
    args[args.index("--state") + 1] = "postgresql+psycopg://sco@127.0.0.1:9/sco"
    # A long-running command waits for the database (a failover) before it gives up.
    code, err = run(*args, env=dict(env, SCO_STATE__START_WAIT_S="2"))
    assert code == 2, err
    assert "cannot reach the database" in err, err
    assert "trying again for up to" in err, err


def test_compute_outage_degrades_and_deletes_nothing(clean: Cloud, tmp_path: Path) -> None:
    provider = _provider()
    runner = _runner(provider, tmp_path / "state.sqlite", _demand(tmp_path, "keep", 2))
    _until(runner, provider, lambda: len(_ready(runner, "keep")) >= 2, 180, "2 ready")
    before = {i.id: i.state for i in runner.store.instances("keep")}
    working = provider.client._sessions

    class _Down:
        def request(self, *a: Any, **kw: Any) -> Any:
            raise ConnectionRefusedError("compute is down")

    provider.client._sessions = lambda service: (
        _Down() if service == "compute" else working(service)
    )
    try:
        reports = [runner.round() for _ in range(8)]
    finally:
        provider.client._sessions = working
    assert all(c.degraded for r in reports for c in r.cycles)
    assert "compute circuit open" in reports[-1].provider_degraded
    assert {i.id: i.state for i in runner.store.instances("keep")} == before
    assert len(clean.of("keep")) == len(before)
    # The breaker lets a probe through after its cool-down; here, force it.
    provider.client.guards["compute"].breaker.succeeded()
    report = runner.round()
    assert not any(c.degraded for c in report.cycles)


def test_credential_never_leaks(clean: Cloud, tmp_path: Path) -> None:
    """A full run at debug level with a recognisable token: the token appears in no
    log line, no state row, no event (the events live in the state database)."""
    canary = "admin#leak-canary-5e1f"
    clouds = yaml.safe_load(clean.clouds_yaml.read_text())
    entry = json.loads(json.dumps(clouds["clouds"][CLOUD]))
    entry["auth"]["token"] = canary
    clouds["clouds"]["sco-canary"] = entry
    other = tmp_path / "clouds.yaml"
    other.write_text(yaml.safe_dump(clouds))
    env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(other))
    state = tmp_path / "state.sqlite"
    args = _run_args(clean, _demand(tmp_path, "leak", 2), state, "--cycles", "15")
    args[args.index("--cloud") + 1] = "sco-canary"
    p = _sco("-vv", *args, env=env)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    assert "plan 1" in err  # it did run, and logged at debug level
    assert clean.of("leak"), "it created servers with that credential"
    secret = "leak-canary-5e1f"
    assert secret not in out
    assert secret not in err
    for f in tmp_path.glob("state.sqlite*"):
        assert secret.encode() not in f.read_bytes(), f


def test_dry_run_prints_intent_and_touches_nothing(clean: Cloud, tmp_path: Path) -> None:
    env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(clean.clouds_yaml))
    state = tmp_path / "state.sqlite"
    p = _sco(*_run_args(clean, _demand(tmp_path, "dry", 3), state, "--dry-run"), env=env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    wanted = [line for line in out.splitlines() if line.startswith("would create")]
    assert wanted, out
    assert sum(int(line.split()[2]) for line in wanted) >= 3
    assert "lab/hall-" in out
    assert "why:" in err  # the plan's reasons
    assert not clean.of("dry")
    assert not state.exists(), "a dry run writes no state"
