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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.scope import excess
from sco.adapters.openstack.secrets import OpenBaoConfig, OpenBaoSecrets
from sco.engine.clock import SystemClock
from sco.ports import Secret
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import sample, wait_for
from sco_harness.keystone import AppCredential, Keystone, clouds_entry
from sco_harness.openstack_stack import ROOT, NovaStack, echo, free_port

BASE_PORT = int(os.environ.get("SCO_TEST_PLATFORM_OS_BASE_PORT", "19860"))
HALLS = {"hall-a": ["pf-a1", "pf-a2"]}
ROLES = ["member", "reader", "sco-capacity-reader"]
PATH = "sco/openstack"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NovaStack]:
    s = NovaStack(tmp_path_factory.mktemp("platform"), BASE_PORT, HALLS, 4, keystone=True)
    try:
        yield s.up()
    finally:
        s.down()


@pytest.fixture(scope="module")
def keystone(stack: NovaStack) -> Keystone:
    ks = Keystone(stack.conn, stack.keystone_url)
    ks.user("sco-svc", "sco", ROLES)
    ks.user("mallory", "other", ["member", "reader"])
    return ks


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaoServer]:
    server = BaoServer(tmp_path_factory.mktemp("bao")).start()
    yield server
    server.stop()


def _clouds(stack: NovaStack, folder: Path) -> Path:
    """sco's clouds.yaml: Keystone's URL only; the credential comes from OpenBao."""
    entry = clouds_entry(stack.keystone_url, application_credential_id="from-openbao")
    path = folder / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": {"sco": entry}}))
    return path


def _sessions(bao: BaoServer, cred: AppCredential, clouds: Path) -> CloudSessions:
    role_id, secret_id = bao.keep_credential(cred.fields(), path=PATH)
    source = OpenBaoSecrets(
        OpenBaoConfig(bao.url, PATH, role_id=role_id, secret_id=Secret(secret_id)),
        SystemClock(),
    )
    return CloudSessions("sco", source, SystemClock(), clouds_file=str(clouds))


def _mallory_server(stack: NovaStack, keystone: Keystone) -> str:
    mallory = keystone.as_user("mallory", "other")
    flavor = stack.conn.compute.find_flavor("spot.small")
    image = stack.conn.image.find_image("cirros-fake")
    body = {
        "server": {
            "name": "mallory-1",
            "flavorRef": flavor.id,
            "imageRef": image.id,
            "availability_zone": "hall-a",
            "networks": "none",
        }
    }
    r = mallory.compute.post("/servers", json=body, microversion="2.90")
    assert r.status_code == 202, r.text
    sid = str(r.json()["server"]["id"])
    wait_for(
        lambda: any(
            s["id"] == sid and s["status"] == "ACTIVE" for s in stack.servers(all_tenants="1")
        ),
        120,
        "mallory's server ACTIVE",
    )
    return sid


def test_keystone_keeps_sco_s_credential_to_its_project(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    theirs = _mallory_server(stack, keystone)
    cred = keystone.app_credential("sco-svc", "sco", ROLES, "sco-least")
    sessions = _sessions(bao, cred, _clouds(stack, tmp_path))
    scope = sessions.scope()
    assert scope.source == "keystone"
    assert scope.project_name == "sco"
    assert excess(scope, ROLES) == [], scope.describe()
    compute = sessions("compute")
    # Refused by Nova under Keystone's token, whatever sco would have done.
    assert compute.get(f"/servers/{theirs}", microversion="2.90").status_code == 404
    assert compute.delete(f"/servers/{theirs}", microversion="2.90").status_code == 404
    listing = compute.get("/servers/detail", params={"all_tenants": "1"}, microversion="2.90")
    assert listing.status_code == 403, listing.text
    mine = compute.get("/servers/detail", microversion="2.90").json()["servers"]
    assert theirs not in {s["id"] for s in mine}
    # The capacity reads the policy files grant the role, and nothing more.
    placement = sessions("placement")
    assert placement.get("/resource_providers", microversion="1.39").status_code == 200
    assert compute.get("/os-hypervisors", microversion="2.90").status_code == 403
    assert any(s["id"] == theirs for s in stack.servers(all_tenants="1"))


def test_an_admin_role_on_the_credential_is_counted_from_keystone(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    keystone.user("sco-broad", "sco", [*ROLES, "admin"])
    cred = keystone.app_credential("sco-broad", "sco", [*ROLES, "admin"], "sco-broad")
    scope = _sessions(bao, cred, _clouds(stack, tmp_path)).scope()
    found = excess(scope, ROLES)
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
    cred = keystone.app_credential("sco-svc", "sco", ROLES, "sco-run")
    role_id, secret_id = bao.keep_credential(cred.fields(), path=PATH)
    region = stack.region(guaranteed=False, halls=["hall-a"])
    region["credential"] = {"openbao": {"url": bao.url, "path": PATH}}
    (tmp_path / "region.yaml").write_text(yaml.safe_dump(region))
    port = free_port()
    doc = {
        "state": {"url": f"sqlite:///{tmp_path / 'state.sqlite'}"},
        "provider": {
            "region_file": str(tmp_path / "region.yaml"),
            "clouds_file": str(_clouds(stack, tmp_path)),
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
    text = log.read_text()
    echo(f"platform: sco run on {cred.roles}: {text.count(chr(10))} log lines")
    assert sample(metrics, "sco_credential_excess") == 0.0, metrics
    assert "could do more than sco needs" not in text, text
    assert cred.secret not in text
