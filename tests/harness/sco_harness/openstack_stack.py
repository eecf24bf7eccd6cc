"""Starting real OpenStack services for tests, through the project's own scripts.

`scripts/openstack/install.sh` installs MariaDB and RabbitMQ from Debian and
builds (or reuses) the pinned OpenStack virtualenv; `placement.sh` and
`nova.sh` start the services. A failure here fails the tests: the OpenStack
tiers are never skipped. What is started is registered with
`sco_harness.services`, so an interrupted test or bench stops it too.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from sco_harness import services

ROOT = Path(__file__).resolve().parents[3]  # a checkout: tests/harness/sco_harness/
SCRIPTS = ROOT / "scripts" / "openstack"


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> str:
    done = services.run(args, env=env, timeout_s=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
    return done.stdout


@cache
def openstack_venv() -> Path:
    """The OpenStack services' virtualenv (built once, then cached by its pins)."""
    out = _run(["bash", str(SCRIPTS / "install.sh")])
    venv = Path(out.strip().splitlines()[-1])
    if not (venv / "bin" / "python").exists():
        raise RuntimeError(f"install.sh printed {venv}, which is no virtualenv")
    return venv


def stack_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["SCO_OPENSTACK_VENV"] = str(openstack_venv())
    env.update(extra)
    return env


def load_placement(db_url: str, spec_file: Path) -> dict[str, Any]:
    import json

    out = _run(
        [
            str(openstack_venv() / "bin" / "python"),
            str(SCRIPTS / "placement_load.py"),
            db_url,
            str(spec_file),
        ],
        env=stack_env(),
    )
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


_placements: dict[Path, services.Started] = {}


def placement_up(folder: Path, port: int, workers: int = 1) -> str:
    _placements[folder] = services.started(f"Placement in {folder}", lambda: placement_down(folder))
    out = _run(
        ["bash", str(SCRIPTS / "placement.sh"), "up", str(folder), str(port), str(workers)],
        env=stack_env(),
    )
    return out.strip().splitlines()[-1]


def placement_down(folder: Path) -> None:
    services.forget(_placements.pop(folder, None))
    _run(["bash", str(SCRIPTS / "placement.sh"), "down", str(folder)], env=stack_env())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_HANDED: set[int] = set()  # steady ports this process gave out (maybe not bound yet)
_PICK = random.SystemRandom()  # a test seeding `random` must not make workers pick alike


def steady_port(low: int = 23000, high: int = 32700) -> int:
    """A port free on every address now, below the kernel's ephemeral range (32768 and
    up), so no outgoing connection takes it before a server that restarts on it binds
    it again (slurmctld keeps its port in slurm.conf; Patroni's PostgreSQL and the
    broker come back on theirs). Random and checked, and never one this process gave
    out before: sessions side by side, and one service's several ports, do not meet."""
    import socket

    for _ in range(500):
        port = _PICK.randrange(low, high)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high}")


def sdk_connection(placement_url: str) -> Any:
    """An openstacksdk connection that reaches only a noauth Placement."""
    import openstack

    return openstack.connect(
        load_yaml_config=False,
        load_envvars=False,
        auth_type="admin_token",
        auth={"endpoint": placement_url, "token": "admin"},
        placement_endpoint_override=placement_url,
    )


def echo(text: str) -> None:
    """Numbers a test measured, for the log (never asserted on)."""
    print(text, file=sys.stderr)


def _capacity(inv: dict[str, Any]) -> int:
    return int((inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0))


def generate_providers(n: int, aggregates: list[str], seed: int) -> list[dict[str, Any]]:
    """Computes of three kinds across the aggregates: spot-capable (with a spot
    slot class), plain (guaranteed), and bare-metal nodes as Ironic exposes them
    (one unit of a custom class, nothing else). Some are disabled, a third busy."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = "ironic" if i % 20 == 19 else ("spot" if i % 2 else "plain")
        traits: list[str] = []
        inventories: dict[str, dict[str, float]]
        if kind == "ironic":
            inventories = {"CUSTOM_BAREMETAL_SPOT": {"total": 1, "max_unit": 1}}
            traits.append("CUSTOM_SPOT_CAPABLE")
        else:
            vcpu = rng.choice([16, 32, 64])
            mem = rng.choice([65536, 131072])
            inventories = {
                "VCPU": {"total": vcpu, "allocation_ratio": 4.0, "max_unit": vcpu},
                "MEMORY_MB": {"total": mem, "reserved": 512, "max_unit": mem},
                "DISK_GB": {"total": 1000, "max_unit": 1000},
            }
            if kind == "spot":
                slots = rng.randint(1, 8)
                inventories["CUSTOM_SPOT_SLOT"] = {"total": slots, "max_unit": slots}
                traits.append("CUSTOM_SPOT_CAPABLE")
        if i % 50 == 7:
            traits.append("COMPUTE_STATUS_DISABLED")
        for inv in inventories.values():
            inv.setdefault("reserved", 0)
            inv.setdefault("allocation_ratio", 1.0)
            inv.update(min_unit=1, step_size=1)
        usages: dict[str, int] = {}
        if i % 3 == 0:
            for rc, inv in inventories.items():
                usages[rc] = rng.randint(0, min(_capacity(inv), int(inv["total"])))
        out.append(
            {
                "uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "name": f"cn-{i:05d}",
                "inventories": inventories,
                "traits": traits,
                "aggregates": [aggregates[i % len(aggregates)]],
                "usages": usages,
            }
        )
    return out


# ---------------------------------------------------------------- the Nova stack


# nova.sh's ports: base + 0..7, Keystone mode + 8, Ironic mode + 9.
STACK_PORTS = 10
SPOT_FLAVOR_SPECS = {"resources:CUSTOM_SPOT_SLOT": "1", "trait:CUSTOM_SPOT_CAPABLE": "required"}
# Ironic mode: every node of resource class baremetal-spot (Placement's
# CUSTOM_BAREMETAL_SPOT), spot-capable, owned by nova-compute host `ironic`;
# a server takes a whole node, so the flavor zeroes the virtual classes.
IRONIC_RC = "baremetal-spot"
IRONIC_HOST = "ironic"
BAREMETAL_FLAVOR = "bm.spot"
BAREMETAL_FLAVOR_SPECS = {
    "resources:CUSTOM_BAREMETAL_SPOT": "1",
    "resources:VCPU": "0",
    "resources:MEMORY_MB": "0",
    "resources:DISK_GB": "0",
    "trait:CUSTOM_SPOT_CAPABLE": "required",
}


def nova_sh(*args: str, env: dict[str, str]) -> None:
    """`nova.sh` to its end. Cut short (a signal, the timeout), `up` gets SIGTERM, and
    its trap stops the half-started stack."""
    done = services.run(["bash", str(SCRIPTS / "nova.sh"), *args], env=env, timeout_s=900)
    if done.returncode != 0:
        raise RuntimeError(f"nova.sh {' '.join(args)} failed:\n{done.stderr[-4000:]}")


class NovaStack:
    """Nova with fake computes, halls as aggregates/zones, and sco's two flavors:
    `spot.small` (one CUSTOM_SPOT_SLOT, spot-capable hosts) and `std.small`."""

    def __init__(
        self,
        folder: Path,
        base_port: int,
        halls: dict[str, list[str]],
        slots: int,
        keystone: bool = False,
        ironic_nodes: int = 0,
        ironic_hall: str = "hall-bm",
    ):
        self.folder = folder
        self.keystone = keystone
        self.ironic_nodes = ironic_nodes
        self.ironic_hall = ironic_hall
        self.halls = halls
        self.slots = slots
        self.base_port = base_port
        self.clouds_yaml = folder / "clouds.yaml"
        self.conn: Any = None
        self._registered: services.Started | None = None

    @property
    def env(self) -> dict[str, str]:
        ironic = {
            "SCO_OS_IRONIC_NODES": str(self.ironic_nodes),
            "SCO_OS_IRONIC_RC": IRONIC_RC,
            "SCO_OS_IRONIC_TRAITS": "CUSTOM_SPOT_CAPABLE",
        }
        return stack_env(
            SCO_OS_BASE_PORT=str(self.base_port),
            SCO_OS_KEYSTONE="1" if self.keystone else "0",
            SCO_OS_IRONIC="1" if self.ironic_nodes else "0",
            **(ironic if self.ironic_nodes else {}),
        )

    @property
    def keystone_url(self) -> str:
        """Keystone's v3 API (Keystone mode: nova.sh puts it on base + 8)."""
        if not self.keystone:
            raise RuntimeError("this stack runs noauth2: no Keystone")
        return f"http://127.0.0.1:{self.base_port + 8}/v3"

    def connect(self) -> NovaStack:
        """A connection to a stack already up (its clouds.yaml)."""
        from openstack import config as sdk_config
        from openstack import connection

        if not self.clouds_yaml.is_file():
            raise RuntimeError(f"no stack in {self.folder} (no clouds.yaml)")
        loader = sdk_config.OpenStackConfig(config_files=[str(self.clouds_yaml)])
        self.conn = connection.Connection(config=loader.get_one(cloud="sco-test"))
        return self

    def up(self) -> NovaStack:
        """Start the stack and its computes. Registered before it starts: interrupted
        half-way, or left running when the process ends, it is stopped."""
        self._registered = services.started(f"Nova stack in {self.folder}", self.down)
        nova_sh("up", str(self.folder), env=self.env)
        self._add_computes([h for hosts in self.halls.values() for h in hosts])
        self.connect()
        computes = sum(len(h) for h in self.halls.values()) + self.ironic_nodes
        _wait(lambda: len(list(self.conn.compute.hypervisors())) == computes, 180)
        spot = self.conn.compute.create_flavor(name="spot.small", vcpus=1, ram=512, disk=1)
        self.conn.compute.create_flavor_extra_specs(spot, SPOT_FLAVOR_SPECS)
        self.conn.compute.create_flavor(name="std.small", vcpus=1, ram=512, disk=1)
        for hall, hosts in self.halls.items():
            agg = self.conn.compute.create_aggregate(name=hall, availability_zone=hall)
            for host in hosts:
                self.conn.compute.add_host_to_aggregate(agg, host)
        if self.ironic_nodes:
            self._baremetal_hall()
        return self

    def _baremetal_hall(self) -> None:
        """The bare-metal flavor, and the Ironic nodes' hall: an aggregate with host
        `ironic`. Nova mirrors a host into Placement's aggregate by one provider
        only, and an Ironic host has one per node: every node's provider is put in
        it, as an operator of Ironic does (`openstack resource provider aggregate set`)."""
        bm = self.conn.compute.create_flavor(name=BAREMETAL_FLAVOR, vcpus=1, ram=512, disk=1)
        self.conn.compute.create_flavor_extra_specs(bm, BAREMETAL_FLAVOR_SPECS)
        agg = self.conn.compute.create_aggregate(
            name=self.ironic_hall, availability_zone=self.ironic_hall
        )
        self.conn.compute.add_host_to_aggregate(agg, IRONIC_HOST)
        placement = self.conn.placement
        found = placement.get(
            "/resource_providers?resources=CUSTOM_BAREMETAL_SPOT:1", microversion="1.39"
        ).json()["resource_providers"]
        for rp in found:
            r = placement.get(f"/resource_providers/{rp['uuid']}/aggregates", microversion="1.39")
            body = {
                "aggregates": sorted({*r.json()["aggregates"], agg.uuid}),
                "resource_provider_generation": r.json()["resource_provider_generation"],
            }
            put = placement.put(
                f"/resource_providers/{rp['uuid']}/aggregates", json=body, microversion="1.39"
            )
            if put.status_code != 200:
                raise RuntimeError(f"aggregate of node {rp['name']}: HTTP {put.status_code}")

    def _add_computes(self, hosts: list[str], timeout_s: float = 900) -> None:
        """`nova.sh add-compute` for every host at once, each a process group of its
        own that an interruption stops (the computes themselves go with `down`)."""
        logs = {h: self.folder / f"add-compute-{h}.log" for h in hosts}
        script = ["bash", str(SCRIPTS / "nova.sh"), "add-compute", str(self.folder)]
        procs = {
            h: services.spawn([*script, h, str(self.slots)], log=logs[h], env=self.env)
            for h in hosts
        }
        deadline = time.monotonic() + timeout_s
        try:
            codes = {
                h: p.wait(timeout=max(0.0, deadline - time.monotonic())) for h, p in procs.items()
            }
        except BaseException:
            for p in procs.values():
                services.stop_group(p, signal.SIGTERM, 5.0)
            raise
        failed = [h for h, code in codes.items() if code != 0]
        if failed:
            tails = "\n".join(f"--- {h}:\n{logs[h].read_text()[-2000:]}" for h in failed)
            raise RuntimeError(f"nova.sh add-compute failed for {failed}:\n{tails}")

    def keep(self) -> NovaStack:
        """Hand the running stack over (`lab up`): it outlives this process."""
        services.forget(self._registered)
        self._registered = None
        return self

    def down(self) -> None:
        services.forget(self._registered)
        self._registered = None
        nova_sh("down", str(self.folder), env=self.env)

    def dead(self) -> dict[str, str]:
        """The stack's services that are no longer running, each with the end of its
        logs: a stack shared by many modules says what died, not only that an API
        answers 500."""
        done = services.run(
            ["bash", str(SCRIPTS / "nova.sh"), "status", str(self.folder)],
            env=self.env,
            timeout_s=60,
        )
        if done.returncode != 0:  # no answer is not "nothing died"
            raise RuntimeError(f"nova.sh status: {done.stderr.strip()[-500:]}")
        names = [ln.split()[0] for ln in done.stdout.splitlines() if ln.endswith(" dead")]
        logs = self.folder / "logs"
        return {
            n: "".join(
                f.read_text(errors="replace")[-1500:]
                for f in (logs / f"{n}.out", logs / f"{n}.log")
                if f.is_file()
            )
            for n in names
        }

    def diagnosis(self) -> str:
        """What `dead` found, as text ('' when every service runs)."""
        try:
            gone = self.dead()
        except Exception as e:  # a report must not hide the failure it explains
            return f"nova.sh status failed: {e}"
        return "".join(f"\n--- {n} is not running; its log ends:\n{t}" for n, t in gone.items())

    def revive(self) -> str:
        """Start the stack again if one of its services died (what died, or '')."""
        report = self.diagnosis()
        if report:
            self.down()
            self.up()
        return report

    def baremetal_pool(self, price_per_h: float = 2.0) -> dict[str, Any]:
        """The region file's pool of the Ironic nodes' hall and the bare-metal flavor."""
        return {
            "hall": self.ironic_hall,
            "flavor": BAREMETAL_FLAVOR,
            "class": "spot",
            "price_per_h": price_per_h,
        }

    def region(
        self, name: str = "lab", guaranteed: bool = True, halls: list[str] | None = None
    ) -> dict[str, Any]:
        """A region file for the stack's halls, or for some of them."""
        return region_spec(halls or list(self.halls), name, guaranteed)

    def clear(self, timeout_s: float = 120) -> None:
        """Delete every project's servers and wait until Placement holds nothing: a
        stack tests share is handed on empty."""
        for s in self.servers(all_tenants="1"):
            self.conn.compute.delete(f"/servers/{s['id']}", microversion="2.90")
        _wait(lambda: not self.servers(all_tenants="1"), timeout_s)
        _wait(self._placement_empty, timeout_s)

    def _placement_empty(self) -> bool:
        """No allocation on any provider, whatever project made it."""
        placement = self.conn.placement
        r = placement.get("/resource_providers", microversion="1.39")
        if r.status_code != 200:
            return False
        for rp in r.json()["resource_providers"]:
            u = placement.get(f"/resource_providers/{rp['uuid']}/usages", microversion="1.39")
            if u.status_code != 200 or any(u.json()["usages"].values()):
                return False
        return True

    def servers(self, **params: str) -> list[dict[str, Any]]:
        r = self.conn.compute.get("/servers/detail", params=params, microversion="2.90")
        if r.status_code != 200:
            raise RuntimeError(
                f"listing servers: HTTP {r.status_code}: {r.text[:300]}{self.diagnosis()}"
            )
        out: list[dict[str, Any]] = [
            s for s in r.json()["servers"] if s.get("OS-EXT-STS:task_state") != "deleting"
        ]
        return out


def region_spec(halls: list[str], name: str = "lab", guaranteed: bool = True) -> dict[str, Any]:
    """A region file for NovaStack's halls and flavors."""
    pools = [
        {"hall": h, "flavor": "spot.small", "class": "spot", "price_per_h": 0.1} for h in halls
    ]
    if guaranteed:
        pools += [
            {"hall": h, "flavor": "std.small", "class": "guaranteed", "price_per_h": 0.3}
            for h in halls
        ]
    return {
        "region": name,
        "image": "cirros-fake",
        "network": "none",
        "headroom_ttl_s": 1,
        "headroom_stale_s": 60,
        "pools": pools,
    }


def _wait(check: Any, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s")
        time.sleep(0.5)
