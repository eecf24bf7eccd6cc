"""Bare metal through a real Ironic (issue 29): sco's `sco run` on a pool whose flavor
asks for a whole Ironic node, on a Nova stack in Keystone and Ironic mode
(`NovaStack(keystone=True, ironic_nodes=N)`), sco's credential from OpenBao; the cloud
operator takes one server back with `sco reclaim` (its own admin credential); sco
replaces it, then hands the partition back. What happened is read from Nova and
Ironic, not from sco.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sco.adapters.openstack.resources import partition_tag
from sco_harness import services
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import wait_for
from sco_harness.keystone import Keystone
from sco_harness.openstack_stack import BAREMETAL_FLAVOR, ROOT, NovaStack, free_port
from sco_harness.seed_platform import ROLES, clouds_file, sco_credential

PARTITION = "metal"
CREDENTIAL_PATH = "sco/baremetal"  # its own path: the rotation bench moves sco/openstack


@dataclass
class Outcome:
    ironic_nodes: int = 0
    created: set[str] = field(default_factory=set)  # bare-metal servers sco created
    reclaimed: str = ""
    replaced: bool = False
    lost: int = 0  # units short when the replacement's time was up (read from Nova/Ironic)
    short_s: float = 0.0  # how long the partition held fewer than its units
    leaked: int = 0  # servers or Ironic nodes still held once the partition is handed back
    timeline: list[str] = field(default_factory=list)


class _Metal:
    def __init__(self, stack: NovaStack, keystone: Keystone, folder: Path) -> None:
        self.stack = stack
        self.folder = folder
        self.sco_project = keystone.project("sco")
        self.started = time.monotonic()
        self.out = Outcome()

    def say(self, line: str) -> None:
        stamp = f"{time.monotonic() - self.started:5.1f} s {line}"
        self.out.timeline.append(stamp)
        print(f"baremetal: {stamp}", file=sys.stderr, flush=True)

    def active(self) -> dict[str, dict[str, Any]]:
        """sco's bare-metal servers ACTIVE in its project, each on an Ironic node."""
        on_nodes = {n.instance_id: n.name for n in self.stack.conn.baremetal.nodes(details=True)}
        return {
            s["id"]: s
            for s in self.stack.servers(all_tenants="1", tags=partition_tag(PARTITION))
            if s["tenant_id"] == self.sco_project
            and s["status"] == "ACTIVE"
            and s["id"] in on_nodes
        }

    def active_if(self, units: int, without: str = "") -> dict[str, dict[str, Any]]:
        """`active()` once it holds `units` servers, none of them `without`; else {}."""
        found = self.active()
        return found if len(found) == units and without not in found else {}

    def held_nodes(self) -> list[str]:
        return [
            n.name
            for n in self.stack.conn.baremetal.nodes(details=True)
            if n.instance_id or n.provision_state != "available"
        ]


def _configs(stack: NovaStack, bao: BaoServer, folder: Path, units: int) -> dict[str, Path]:
    """sco's config (credential from OpenBao) and the operator's (the cloud's admin,
    acting on sco's project)."""
    region = stack.region(guaranteed=False) | {"pools": [stack.baremetal_pool()]}
    (folder / "operator-region.yaml").write_text(yaml.safe_dump(region))
    region["credential"] = {"openbao": {"url": bao.url, "path": CREDENTIAL_PATH}}
    (folder / "region.yaml").write_text(yaml.safe_dump(region))
    clouds = yaml.safe_load(clouds_file(stack, folder).read_text())
    clouds["clouds"]["operator"] = yaml.safe_load(stack.clouds_yaml.read_text())["clouds"][
        "sco-test"
    ]
    (folder / "clouds.yaml").write_text(yaml.safe_dump(clouds))
    state = f"sqlite:///{folder / 'state.sqlite'}"
    partition = {"name": PARTITION, "kind": "slurm", "target_units": units, "max_units": units}
    sco = {
        "state": {"url": state},
        "provider": {"region_file": str(folder / "region.yaml"), "cloud": "sco",
                     "clouds_file": str(folder / "clouds.yaml"), "roles": ROLES},
        "partitions": [partition],
        "policy": {"interval_s": 1},
        "http": {"bind": "127.0.0.1", "run_port": free_port()},
    }  # fmt: skip
    keystone = Keystone(stack.conn, stack.keystone_url)
    operator = {
        "state": {"url": state},
        "provider": {"region_file": str(folder / "operator-region.yaml"), "cloud": "operator",
                     "clouds_file": str(folder / "clouds.yaml"),
                     "projects": [keystone.project("sco")]},
        "partitions": [partition],
    }  # fmt: skip
    paths = {"sco": folder / "sco.yaml", "operator": folder / "operator.yaml"}
    paths["sco"].write_text(yaml.safe_dump(sco))
    paths["operator"].write_text(yaml.safe_dump(operator))
    return paths


def _sco(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sco {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def run(
    stack: NovaStack, bao: BaoServer, folder: Path, *, units: int = 2, notice_s: float = 5.0,
    within_s: float = 180.0,
) -> Outcome:  # fmt: skip
    """sco holds `units` bare-metal servers; the operator reclaims one with notice; sco
    replaces it; `sco handback` gives every node back."""
    keystone = Keystone(stack.conn, stack.keystone_url)
    metal = _Metal(stack, keystone, folder)
    metal.out.ironic_nodes = len(list(stack.conn.baremetal.nodes()))
    role_id, secret_id = bao.keep_credential(
        sco_credential(keystone, "sco-baremetal").fields(), path=CREDENTIAL_PATH
    )
    configs = _configs(stack, bao, folder, units)
    env = dict(os.environ, BAO_ROLE_ID=role_id, BAO_SECRET_ID=secret_id)
    cmd = [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(configs["sco"])]
    proc = services.spawn(cmd, log=folder / "sco-run.log", cwd=ROOT, env=env)
    try:
        first = wait_for(lambda: metal.active_if(units), within_s,
                         f"{units} bare-metal servers ACTIVE", every_s=1)  # fmt: skip
        metal.out.created |= set(first)
        metal.say(f"{units} bare-metal servers ACTIVE on Ironic nodes")
        _reclaim_one(metal, configs["operator"], notice_s)
        again = _replacement(metal, units, within_s)
        metal.out.created |= set(again)
        metal.out.replaced = bool(set(again) - set(first))
        metal.out.lost = max(0, units - len(again))
        metal.say(f"replaced: {sorted(set(again) - set(first))}; {metal.out.lost} units short, "
                  f"{metal.out.short_s:.0f} s below {units}")  # fmt: skip
        _sco("handback", PARTITION, "--config", str(configs["sco"]), "--timeout", "3m", env=env)
        metal.say("handed back")
        _settle(metal, within_s)
    finally:
        services.stop_group(proc, signal.SIGTERM, 60)
    return metal.out


def _replacement(metal: _Metal, units: int, within_s: float) -> dict[str, dict[str, Any]]:
    """What the partition holds once it is whole again without the reclaimed server, or
    when `within_s` is up: read from Nova and Ironic every second, the seconds it held
    fewer than `units` counted (a count short at the end is lost, not an error)."""
    started = time.monotonic()
    while True:
        held = {k: v for k, v in metal.active().items() if k != metal.out.reclaimed}
        now = time.monotonic()
        if len(held) < units:
            metal.out.short_s = now - started
        if len(held) >= units or now - started >= within_s:
            return held
        time.sleep(1)


def _reclaim_one(metal: _Metal, operator: Path, notice_s: float) -> None:
    before = metal.active()
    said = _sco(
        "reclaim", "--config", str(operator), "--hall", metal.stack.ironic_hall,
        "--flavor", BAREMETAL_FLAVOR, "--count", "1", "--notice", f"{notice_s:.0f}s",
    )  # fmt: skip
    gone = set(before) - set(metal.active())
    metal.out.reclaimed = next(iter(gone), "")
    metal.say(f"operator reclaimed {metal.out.reclaimed or '?'} with {notice_s:.0f} s notice: "
              f"{said.strip().splitlines()[-1] if said.strip() else ''}")  # fmt: skip


def _settle(metal: _Metal, within_s: float) -> None:
    """Every server gone from Nova and every node available with no instance; what
    still is after `within_s` is leaked."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        servers = metal.stack.servers(all_tenants="1", tags=partition_tag(PARTITION))
        held = metal.held_nodes()
        if not servers and not held:
            break
        time.sleep(1)
    metal.out.leaked = len(servers) + len(held)
    metal.say(f"after handback: {len(servers)} servers, nodes held {held}")
