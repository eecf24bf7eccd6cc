"""The seed's platform for real (issue 29): sco's cloud credential is a Keystone
application credential, restricted to sco's project and roles, read from a real
OpenBao through AppRole, and Keystone (with Nova's and Placement's policies) is what
keeps sco to its project, not only sco's own check.

One Nova stack in Keystone mode for the module (`NovaStack(keystone=True)`): real
Keystone, keystonemiddleware in every API, and policy files that let the role
`sco-capacity-reader` read aggregates and allocation candidates, as
docs/security.md recommends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from sco.adapters.openstack import open_provider
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.scope import excess
from sco.engine.clock import SystemClock
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import sample, wait_for
from sco_harness.keystone import AppCredential, Keystone
from sco_harness.openstack_stack import BAREMETAL_FLAVOR, ROOT, NovaStack, echo, free_port
from sco_harness.seed_platform import (
    PATH,
    REFUSED,
    ROLES,
    Replica,
    clouds_file,
    foreign_answers,
    foreign_server,
    sco_credential,
)

BASE_PORT = int(os.environ.get("SCO_TEST_PLATFORM_OS_BASE_PORT", "19860"))
HALLS = {"hall-a": ["pf-a1", "pf-a2"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NovaStack]:
    folder = tmp_path_factory.mktemp("platform")
    s = NovaStack(folder, BASE_PORT, HALLS, 4, keystone=True, ironic_nodes=4)
    try:
        yield s.up()
    finally:
        s.down()


@pytest.fixture(scope="module")
def keystone(stack: NovaStack) -> Keystone:
    ks = Keystone(stack.conn, stack.keystone_url)
    ks.user("mallory", "other", ["member", "reader"])
    return ks


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaoServer]:
    server = BaoServer(tmp_path_factory.mktemp("bao")).start()
    yield server
    server.stop()


def _replica(stack: NovaStack, bao: BaoServer, cred: AppCredential, folder: Path) -> Replica:
    role = bao.keep_credential(cred.fields(), path=PATH)
    return Replica(bao, role, clouds_file(stack, folder))


def test_keystone_keeps_sco_s_credential_to_its_project(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    theirs = foreign_server(stack, keystone, "mallory", "other")
    cred = sco_credential(keystone, "sco-least")
    sessions = _replica(stack, bao, cred, tmp_path).sessions
    scope = sessions.scope()
    assert (scope.source, scope.project_name) == ("keystone", "sco")
    assert excess(scope, ROLES) == [], scope.describe()
    # Refused by Nova under Keystone's token, whatever sco would have done.
    assert foreign_answers(sessions, theirs) == REFUSED
    compute: Any = sessions("compute")
    mine = compute.get("/servers/detail", microversion="2.90").json()["servers"]
    assert theirs not in {s["id"] for s in mine}
    # The capacity reads the policy files grant the role, and nothing more.
    placement: Any = sessions("placement")
    assert placement.get("/resource_providers", microversion="1.39").status_code == 200
    assert compute.get("/os-hypervisors", microversion="2.90").status_code == 403
    assert any(s["id"] == theirs for s in stack.servers(all_tenants="1"))


def test_an_admin_role_on_the_credential_is_counted_from_keystone(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    keystone.user("sco-broad", "sco", [*ROLES, "admin"])
    cred = keystone.app_credential("sco-broad", "sco", [*ROLES, "admin"], "sco-broad")
    found = excess(_replica(stack, bao, cred, tmp_path).sessions.scope(), ROLES)
    # Keystone reports the roles admin implies too (manager).
    assert any(e.startswith("role admin") for e in found), found
    assert "roles beyond provider.roles: manager" in found, found


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_sco_run_on_the_restricted_credential_from_openbao(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    """`sco run` as a user runs it: AppRole in its environment, the application
    credential in OpenBao, a clouds.yaml with Keystone's URL and nothing secret."""
    cred = sco_credential(keystone, "sco-run")
    role_id, secret_id = bao.keep_credential(cred.fields(), path=PATH)
    region = stack.region(guaranteed=False, halls=["hall-a"])
    region["credential"] = {"openbao": {"url": bao.url, "path": PATH}}
    (tmp_path / "region.yaml").write_text(yaml.safe_dump(region))
    port = free_port()
    doc = {
        "state": {"url": f"sqlite:///{tmp_path / 'state.sqlite'}"},
        "provider": {
            "region_file": str(tmp_path / "region.yaml"),
            "clouds_file": str(clouds_file(stack, tmp_path)),
            "cloud": "sco",
            "roles": ROLES,
        },
        "partitions": [{"name": "bm", "kind": "slurm", "target_units": 2, "max_units": 2}],
        "policy": {"interval_s": 1},
        "http": {"bind": "127.0.0.1", "run_port": port},
    }
    (tmp_path / "sco.yaml").write_text(yaml.safe_dump(doc))
    env = dict(os.environ, BAO_ROLE_ID=role_id, BAO_SECRET_ID=secret_id)
    log = tmp_path / "run.log"
    run = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(tmp_path / "sco.yaml")],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    sco_project = keystone.project("sco")
    try:

        def two_active() -> list[dict[str, Any]]:
            found = [
                s
                for s in stack.servers(all_tenants="1", tags="sco")
                if s["tenant_id"] == sco_project and s["status"] == "ACTIVE"
            ]
            return found if len(found) == 2 else []

        wait_for(two_active, 180, "sco's 2 servers ACTIVE in project sco", every_s=1)
        metrics = wait_for(
            lambda: m if "sco_credential_excess " in (m := _scrape(port)) else "",
            30,
            "sco's metrics",
        )
    finally:
        run.terminate()
        run.wait(timeout=60)
        stack.clear()
    text = log.read_text()
    assert sample(metrics, "sco_credential_excess") == 0.0, metrics
    assert "could do more than sco needs" not in text, text
    assert cred.secret not in text


def test_an_ironic_node_in_maintenance_or_not_available_is_no_room(stack: NovaStack) -> None:
    """sco's headroom for a bare-metal pool is Placement's inventory of the Ironic
    nodes: a node in maintenance, or taken out of `available` (manageable, cleaning),
    is reserved by Nova's ironic driver, and counts as no room."""
    region = stack.region(guaranteed=False) | {"pools": [stack.baremetal_pool()]}
    provider = open_provider(
        RegionSpec.model_validate(region), "sco-test", SystemClock(), str(stack.clouds_yaml)
    )
    provider.discover()
    pool = f"lab/{stack.ironic_hall}/{BAREMETAL_FLAVOR}"

    def room_becomes(n: int) -> None:
        wait_for(lambda: provider.refresh().rooms[pool] == n, 60, f"{n} nodes of room")

    metal = stack.conn.baremetal
    nodes = sorted(metal.nodes(), key=lambda n: n.name)
    room_becomes(len(nodes))
    metal.set_node_maintenance(nodes[0], reason="test: firmware")
    room_becomes(len(nodes) - 1)
    metal.set_node_provision_state(nodes[1], "manage", wait=True)
    room_becomes(len(nodes) - 2)
    metal.unset_node_maintenance(nodes[0])
    metal.set_node_provision_state(nodes[1], "provide", wait=True)
    room_becomes(len(nodes))


def test_the_platform_bench_at_smoke_size(
    stack: NovaStack, tmp_path: Path, bench: Callable[[str], ModuleType]
) -> None:
    """bench/seed_platform.py on this module's stack and an OpenBao of its own (it
    seals it), on short leases: renewals, fresh logins, two rotations through
    Keystone, a foreign server refused, a seal survived."""
    platform = bench("seed_platform")
    bao = BaoServer(tmp_path / "bao").start()
    try:
        result = platform.measure(stack, bao, tmp_path, ttl=2, max_ttl=6, rotations=2, seconds=12)
    finally:
        bao.stop()
    echo(f"platform bench (smoke): {result}")
    assert result["openbao_version"].startswith("2."), result
    assert platform.passed(result), result
    assert result["credential_rotations"] == 2, result
