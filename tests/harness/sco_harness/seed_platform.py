"""The seed's platform (issue 29) for tests and bench/seed_platform.py: sco's cloud
credential as a Keystone application credential in a real OpenBao, on a Nova stack in
Keystone mode, and what Keystone lets it do.

A *replica* here is what each `sco run` replica holds: its own AppRole login to
OpenBao (`OpenBaoSecrets`) and the sessions to the cloud built from what it reads
(`CloudSessions`), on the wall clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from sco.adapters.openbao import OpenBaoConfig, OpenBaoSecrets
from sco.adapters.openstack.connect import CloudSessions
from sco.engine.clock import SystemClock
from sco.ports import Secret
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import wait_for
from sco_harness.keystone import AppCredential, Keystone, clouds_entry
from sco_harness.openstack_stack import NovaStack

# sco's roles on its project: Nova's member (and reader) and the role the stack's
# policy files let read aggregates and allocation candidates (docs/security.md).
ROLES = ["member", "reader", "sco-capacity-reader"]
PATH = "sco/openstack"  # the credential's KV v2 path in OpenBao
MICROVERSION = "2.90"


def clouds_file(stack: NovaStack, folder: Path, cloud: str = "sco") -> Path:
    """sco's clouds.yaml: Keystone's URL only; the credential comes from OpenBao."""
    entry = clouds_entry(stack.keystone_url, application_credential_id="from-openbao")
    path = folder / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": {cloud: entry}}, sort_keys=False))
    return path


class Replica:
    """One sco replica's hold on the credential: OpenBao through AppRole, then Keystone."""

    def __init__(self, bao: BaoServer, role: tuple[str, str], clouds: Path, **bao_opts: Any):
        config = OpenBaoConfig(
            bao.url, PATH, role_id=role[0], secret_id=Secret(role[1]), **bao_opts
        )
        self.secrets = OpenBaoSecrets(config, SystemClock())
        self.sessions = CloudSessions("sco", self.secrets, SystemClock(), clouds_file=str(clouds))

    def holds(self, cred: AppCredential) -> bool:
        held = self.sessions.held()
        return held is not None and held.revealed()["application_credential_id"] == cred.id

    def lists_its_servers(self) -> bool:
        """One API call on what it holds now (renewing first when due)."""
        compute: Any = self.sessions("compute")
        r = compute.get("/servers", microversion=MICROVERSION)
        return bool(r.status_code == 200)


def sco_credential(keystone: Keystone, name: str) -> AppCredential:
    """Project sco, its service user sco-svc with ROLES, and an application
    credential of it holding them."""
    keystone.user("sco-svc", "sco", ROLES)
    return keystone.app_credential("sco-svc", "sco", ROLES, name)


def foreign_server(
    stack: NovaStack, keystone: Keystone, user: str, project: str, **server: Any
) -> str:
    """A server booted by another project's member, ACTIVE; `server`: more of the
    request's fields (a name, tags, metadata, a zone)."""
    conn = keystone.as_user(user, project)
    body = {
        "server": {
            "name": f"{project}-1",
            "flavorRef": stack.conn.compute.find_flavor("spot.small").id,
            "imageRef": stack.conn.image.find_image("cirros-fake").id,
            "networks": "none",
            **server,
        }
    }
    r = conn.compute.post("/servers", json=body, microversion=MICROVERSION)
    if r.status_code != 202:
        raise RuntimeError(f"{user} could not boot: HTTP {r.status_code}: {r.text[:300]}")
    sid = str(r.json()["server"]["id"])
    wait_for(
        lambda: any(
            s["id"] == sid and s["status"] == "ACTIVE" for s in stack.servers(all_tenants="1")
        ),
        120,
        f"{project}'s server ACTIVE",
    )
    return sid


def foreign_answers(sessions: CloudSessions, server: str) -> dict[str, int]:
    """What Nova, under Keystone's token, answers sco's credential about a server of
    another project: each request's HTTP status."""
    compute: Any = sessions("compute")
    return {
        "show": compute.get(f"/servers/{server}", microversion=MICROVERSION).status_code,
        "delete": compute.delete(f"/servers/{server}", microversion=MICROVERSION).status_code,
        "all_tenants": compute.get(
            "/servers/detail", params={"all_tenants": "1"}, microversion=MICROVERSION
        ).status_code,
    }


REFUSED = {"show": 404, "delete": 404, "all_tenants": 403}


def rotate(
    keystone: Keystone,
    bao: BaoServer,
    replicas: list[Replica],
    old: AppCredential,
    name: str,
    within_s: float,
) -> tuple[AppCredential, bool]:
    """One rotation as docs/security.md tells an operator: a new application credential
    written to OpenBao; once every replica holds it (and works with it), the old one
    revoked in Keystone. True when every replica moved within `within_s`, Keystone
    then refused the old one and every replica went on working."""
    new = sco_credential(keystone, name)
    bao.write(new.fields(), path=PATH)
    deadline = time.monotonic() + within_s
    moved = False
    while time.monotonic() < deadline and not moved:
        working = all(r.lists_its_servers() for r in replicas)
        moved = working and all(r.holds(new) for r in replicas)
        time.sleep(0.2)
    if not moved:
        return new, False
    keystone.revoke(old)
    return new, not keystone.authenticates(old) and all(r.lists_its_servers() for r in replicas)
