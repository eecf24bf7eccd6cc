"""The seed's platform for real (issue 29), and least privilege against it
(docs/security.md): sco's cloud credential is a Keystone application credential,
restricted to sco's project and roles, read from a real OpenBao through AppRole, and
Keystone (with Nova's and Placement's policies) keeps sco to its project, not only
sco's own check; bare metal goes through a real Ironic.

- Nova refuses sco's restricted credential another project's server; an admin role on
  it is counted from Keystone's answer; `sco run` on it holds its servers in project
  sco with `sco_credential_excess` 0.
- sco's own rule where Keystone lets it see more (an admin's credential owning two
  projects): a server of another project dressed as sco's survives `sco run` and the
  cloud operator's `sco reclaim`, and both report it; a creating command whose
  credential is scoped outside sco's projects does not start.
- An Ironic node in maintenance or out of `available` is no room.
- bench/seed_platform.py at a smoke size: renewals, rotations through Keystone,
  bare metal created, reclaimed and replaced, handed back.

One stack for the module: `NovaStack(keystone=True, ironic_nodes=4)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from sco.adapters.openstack import CloudsYamlSecrets, open_provider
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.resources import (
    META_NODE_TOKEN,
    META_RECLAIM_AT,
    partition_tag,
    server_metadata,
    server_tags,
)
from sco.adapters.openstack.scope import excess
from sco.engine.clock import SystemClock
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import sample, scrape, wait_for
from sco_harness.keystone import AppCredential, Keystone, clouds_entry
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

MICROVERSION = "2.90"
SPOT_A = "lab/hall-a/spot.small"
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


def _mallory_server(stack: NovaStack, keystone: Keystone, partition: str) -> str:
    """A server of mallory's project dressed as sco's: its tags, its metadata, and a
    reclaim notice whose deadline passed long ago."""
    request = "req-mallory"
    return foreign_server(
        stack, keystone, "mallory", "other",
        name=f"sco-{partition}-{request}", availability_zone="hall-a",
        tags=server_tags(partition, request),
        metadata=server_metadata(partition, SPOT_A, "spot", request, 1) | {META_RECLAIM_AT: "1"},
    )  # fmt: skip


def _everyone(stack: NovaStack, **params: str) -> list[dict[str, Any]]:
    """Every project's servers (the cloud's admin), not being deleted."""
    return stack.servers(all_tenants="1", **params)


def test_a_foreign_server_survives_sco_and_the_operators_reclaimer(
    stack: NovaStack, keystone: Keystone, tmp_path: Path
) -> None:
    """sco's own rule, beyond what Keystone enforces: sco's credential here is an
    admin's (it owns two projects, so it lists across them, and sees every project's
    servers), and a server of another project dressed as sco's is left alone."""
    keystone.user("sco-admin", "sco", ["admin"])
    cred = keystone.app_credential("sco-admin", "sco", ["admin"], "sco-foreign")
    sco_id, spare_id, mallory_id = (keystone.project(p) for p in ("sco", "sco-spare", "other"))
    operator = yaml.safe_load(stack.clouds_yaml.read_text())["clouds"]["sco-test"]
    clouds = tmp_path / "clouds.yaml"
    entries = {"sco": clouds_entry(stack.keystone_url, **cred.fields()), "operator": operator}
    clouds.write_text(yaml.safe_dump({"clouds": entries}))
    region = tmp_path / "region.yaml"
    region.write_text(yaml.safe_dump(stack.region(guaranteed=False, halls=["hall-a"])))
    state = f"sqlite:///{tmp_path / 'state.sqlite'}"
    partition = "fx"
    theirs = _mallory_server(stack, keystone, partition)
    port = free_port()

    def config(name: str, provider: dict[str, Any]) -> Path:
        doc = {
            "state": {"url": state},
            "provider": {"region_file": str(region), "clouds_file": str(clouds), **provider},
            "partitions": [
                {
                    "name": partition,
                    "kind": "slurm",
                    "target_units": 2,
                    "max_units": 2,
                    "agents": True,
                }
            ],
            "policy": {"interval_s": 1},
            "http": {"bind": "127.0.0.1", "run_port": port},
        }
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc))
        return path

    # sco owns two projects, so it lists across tenants: mallory's server is in its
    # listing, tagged for its partition.
    sco_yaml = config("sco.yaml", {"cloud": "sco", "projects": [sco_id, spare_id]})
    log = tmp_path / "run.log"
    run = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(sco_yaml)],
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:

        def ours_with_tokens() -> list[dict[str, Any]]:
            found = [
                s
                for s in _everyone(stack, tags=partition_tag(partition))
                if s["tenant_id"] == sco_id
                and s["status"] == "ACTIVE"
                and META_NODE_TOKEN in s["metadata"]
            ]
            return found if len(found) >= 2 else []

        ours = wait_for(ours_with_tokens, 180, "sco's 2 servers with node tokens", every_s=1)
        metrics = wait_for(
            lambda: m if "sco_foreign_servers{" in (m := scrape(port)) else "",
            30,
            "the foreign server counted",
        )
        time.sleep(3)  # more cycles: the warning stays one line, the server stays
    finally:
        run.terminate()
        run.wait(timeout=60)
    text = log.read_text()
    assert sample(metrics, "sco_foreign_servers", project=mallory_id) == 1.0, metrics
    # The admin role, and the manager role Keystone says it implies.
    assert sample(metrics, "sco_credential_excess") == 2.0, metrics
    assert text.count(f"foreign server {theirs} in project {mallory_id} left alone") == 1, text
    assert "credential could do more than sco needs: role admin" in text, text
    survivor = {s["id"]: s for s in _everyone(stack)}[theirs]
    assert META_NODE_TOKEN not in survivor["metadata"], "a node token went to mallory"
    assert survivor["metadata"][META_RECLAIM_AT] == "1"
    assert len(ours) == 2

    # The cloud operator's reclaimer, with the cloud's admin credential: sco's project
    # is not its own, so it lists across tenants. Mallory's notice ran out long ago;
    # one of sco's servers is noticed too.
    operator_yaml = config("operator.yaml", {"cloud": "operator", "projects": [sco_id]})
    noticed = ours[0]["id"]
    r = stack.conn.compute.put(
        f"/servers/{noticed}/metadata/{META_RECLAIM_AT}",
        json={"meta": {META_RECLAIM_AT: "1"}},
        microversion=MICROVERSION,
    )
    assert r.status_code == 200, r.text
    sweep = _sco("reclaim", "--config", str(operator_yaml), "--sweep", "--json")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    done = json.loads(sweep.stdout)
    assert done == {"deleted": [noticed], "foreign": {theirs: mallory_id}}, done
    assert f"foreign server {theirs} in project {mallory_id} left alone" in sweep.stderr
    assert "credential could do more than sco needs" in sweep.stderr
    asked = _sco(
        "reclaim", "--config", str(operator_yaml), "--hall", "hall-a", "--flavor",
        "spot.small", "--count", "5", "--notice", "600s", "--no-wait", "--json",
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert theirs not in json.loads(asked.stdout)["noticed"]
    assert theirs in {s["id"] for s in _everyone(stack)}, "mallory's server was deleted"

    # A creating command with a credential outside sco's projects does not start.
    refused = _sco("run", "--config", str(operator_yaml), "--cycles", "1")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "provider.projects" in refused.stderr
    assert "not one of sco's projects" in refused.stderr
    echo(
        f"foreign server: left alone by sco run (reported once, sco_foreign_servers 1) "
        f"and by the operator's sweep, which deleted sco's noticed {noticed}"
    )
    stack.clear()


def _sco(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_an_admin_role_on_the_credential_is_counted_from_keystone(
    stack: NovaStack, keystone: Keystone, bao: BaoServer, tmp_path: Path
) -> None:
    keystone.user("sco-broad", "sco", [*ROLES, "admin"])
    cred = keystone.app_credential("sco-broad", "sco", [*ROLES, "admin"], "sco-broad")
    found = excess(_replica(stack, bao, cred, tmp_path).sessions.scope(), ROLES)
    # Keystone reports the roles admin implies too (manager).
    assert any(e.startswith("role admin") for e in found), found
    assert "roles beyond provider.roles: manager" in found, found


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
            lambda: m if "sco_credential_excess " in (m := scrape(port)) else "",
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
    spec, clouds = RegionSpec.model_validate(region), str(stack.clouds_yaml)
    provider = open_provider(spec, "sco-test", CloudsYamlSecrets(), SystemClock(), clouds)
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
