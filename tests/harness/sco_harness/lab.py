"""A local OpenStack to try sco on: `make lab` (and `make lab-down`).

    python -m sco_harness.lab up DIR [--base-port N]   start it, write DIR/sco.yaml
    python -m sco_harness.lab servers DIR              what sco holds there
    python -m sco_harness.lab reclaim DIR SERVER|--partition P [--notice S]
                                                       take a spot server back (or one of
                                                       P's), as a cloud operator would
                                                       (with a notice of S seconds, or at
                                                       once)
    python -m sco_harness.lab down DIR

`up` starts Nova (fake virt driver, four computes), Placement, Glance and
Neutron's API on loopback (`scripts/openstack/nova.sh`), creates a spot and a
guaranteed flavor and two halls (host aggregates that are availability
zones), and writes what sco needs to run on it: `clouds.yaml`, `region.yaml`
and `sco.yaml` (embedded defaults: SQLite state and event log, chDB history),
with a Kubernetes partition (`web`) and a Slurm one (`batch`, with agents).
Then, under a supervisor (`sco_harness.lab_plane`; one log, `lab.log`): the
world (`sco_harness.lab_world`: OpenBao with the cloud credential, slurmctld,
the Kubernetes stand-in, the servers' slurmd, Nodes and agents), two `sco run`
replicas, `sco watch`, `sco history load` scoring, `sco distributor` and `sco
status`; and prints where everything answers. `--no-plane` starts the cloud
alone. docs/tour.md is the walk through it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from sco.adapters.openstack.resources import META_CLASS, META_PARTITION, META_RECLAIM_AT
from sco.domain.times import utc
from sco_harness import lab_plane, lab_world
from sco_harness.openstack_stack import BAREMETAL_FLAVOR, NovaStack
from sco_harness.seed_platform import ROLES, clouds_file
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"]}
SLOTS = 4
IRONIC_NODES = 2  # bare-metal nodes (fake-hardware) in hall-bm, for the `metal` partition
VIRTUAL = ["spot.small", "std.small"]  # the flavors of web's and batch's nodes
CLOUD = "sco-test"
CREDENTIAL_PATH = "sco/openstack"  # in the lab's OpenBao


def sco_yaml(http_base: int = lab_plane.BASE) -> dict[str, Any]:
    return {
        "state": {"url": "sqlite:///state.sqlite"},
        "events": {"kind": "embedded"},
        "history": {"url": "chdb://history"},
        "leases": {"kind": "database", "ttl_s": 15},
        "provider": {
            "kind": "openstack",
            "cloud": CLOUD,
            "region_file": "region.yaml",
            "clouds_file": "clouds.yaml",
            "roles": ROLES,
        },
        "slurm": {"lab": {"conf": "slurm/slurm.conf", "cache_s": 1, "timeout_s": 5}},
        "kubernetes": {"lab": {"kubeconfig": "kubeconfig", "timeout_s": 3}},
        "partitions": [
            {
                "name": "web",
                "kind": "kubernetes",
                "demand": "kubernetes",
                "floor_units": 1,
                "max_units": 6,
                "flavors": VIRTUAL,
                "kubernetes": {
                    "cluster": "lab",
                    "allocatable": lab_world.ALLOCATABLE,
                    "spot_taint": True,
                },
            },
            {
                "name": "batch",
                "kind": "slurm",
                "demand": "slurm",
                "floor_units": 0,
                "max_units": 8,
                "flavors": VIRTUAL,
                "agents": True,
                "slurm": {
                    "cluster": "lab",
                    "partitions": ["batch"],
                    "cpus": 2,
                    "memory_mb": 1000,
                    "requeue_lead_s": 10,
                    "idle_keep_s": 60,
                },
            },
            {  # one whole Ironic node, held at a fixed target
                "name": "metal",
                "kind": "slurm",
                "target_units": 1,
                "max_units": IRONIC_NODES,
                "flavors": [BAREMETAL_FLAVOR],
            },
        ],
        # Two halls make two spot pools: excluding one must not need a third.
        "policy": {"name": "sco", "interval_s": 5, "exclusion": {"min_candidates": 1}},
        "http": lab_plane.http_section(http_base),
        "distributor": {"port": lab_plane.ports(http_base)["distributor"]},
        "log": {"level": "info", "format": "text"},
    }


def up(folder: Path, base_port: int, http_base: int, plane: bool) -> None:
    if lab_plane.running(folder):
        raise SystemExit(f"lab: already up in {folder} (make lab-down first)")
    folder.mkdir(parents=True, exist_ok=True)
    _forget_last(folder)
    started = time.monotonic()
    # Interrupted (Ctrl-C, SIGTERM) before it is written out, the stack is stopped;
    # once it is, it is the user's until `lab down`.
    stack = stack_of(folder, base_port).up()
    print(
        f"lab: Keystone, Nova, Placement, Glance, Neutron and Ironic up in "
        f"{time.monotonic() - started:.0f} s; {sum(len(h) for h in HALLS.values())} computes "
        f"in {len(HALLS)} halls, {SLOTS} spot slots each; {IRONIC_NODES} Ironic nodes in "
        f"{stack.ironic_hall}",
        file=sys.stderr,
    )
    region = stack.region()
    region["pools"].append(stack.baremetal_pool())
    if plane:  # the world's OpenBao holds the credential; clouds.yaml has none
        port = lab_plane.openbao_ports(http_base)[0]
        region["credential"] = {
            "openbao": {"url": f"http://127.0.0.1:{port}", "path": CREDENTIAL_PATH}
        }
    (folder / "region.yaml").write_text(yaml.safe_dump(region, sort_keys=False))
    if plane:  # Keystone's URL only: the application credential is in OpenBao
        clouds_file(stack, folder, CLOUD)
    else:
        shutil.copy(stack.clouds_yaml, folder / "clouds.yaml")
    (folder / "sco.yaml").write_text(
        "# sco on the local test stack (make lab): embedded state, log and history.\n"
        + yaml.safe_dump(sco_yaml(http_base), sort_keys=False)
    )
    if plane:
        lab_plane.start(folder, http_base, base_port)
        try:
            lab_plane.wait_ready(folder, http_base)
        except BaseException:
            lab_plane.stop(folder)
            raise
    stack.keep()
    print(f"lab: wrote {folder / 'sco.yaml'}, region.yaml, clouds.yaml", file=sys.stderr)
    if plane:
        print(f"lab: control plane up in {time.monotonic() - started:.0f} s from the start")
        for line in lab_plane.endpoints(folder, http_base):
            print(f"lab: {line}")


def _forget_last(folder: Path) -> None:
    """A new cloud: what the last lab's sco, Slurm and agents knew is of no use."""
    for what in lab_world.sweep(folder):
        print(f"lab: swept {what} (left by the last lab)", file=sys.stderr)
    for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm", "lab.log"):
        (folder / name).unlink(missing_ok=True)
    for name in ("history", "slurm", "agents", "openbao"):
        shutil.rmtree(folder / name, ignore_errors=True)


def stack_of(folder: Path, base_port: int) -> NovaStack:
    """The lab's Nova stack: Keystone mode, so sco runs on an application credential
    Keystone restricts to project sco."""
    return NovaStack(
        folder / "stack", base_port, HALLS, SLOTS, keystone=True, ironic_nodes=IRONIC_NODES
    )


def _stack(folder: Path, base_port: int) -> NovaStack:
    return stack_of(folder, base_port).connect()


def servers(folder: Path, base_port: int) -> None:
    for s in _stack(folder, base_port).servers(all_tenants="1", tags="sco"):
        meta = s.get("metadata") or {}
        print(
            f"{s['id']}  {s['status']:<7} {meta.get(META_PARTITION, '?'):<10} "
            f"{meta.get(META_CLASS, '?'):<10} {s.get('OS-EXT-AZ:availability_zone', '?'):<7} "
            f"{meta.get(META_RECLAIM_AT, '')}"
        )


def _one_of(folder: Path, base_port: int, partition: str) -> str:
    """A spot server of `partition` with no notice yet (the oldest: it has served)."""
    found = [
        s
        for s in _stack(folder, base_port).servers(all_tenants="1", tags="sco")
        if s["status"] == "ACTIVE" and _unnoticed_spot_of(s.get("metadata") or {}, partition)
    ]
    if not found:
        raise SystemExit(f"lab: no spot server of {partition} to reclaim")
    return str(min(found, key=lambda s: (s.get("created", ""), s["id"]))["id"])


def _unnoticed_spot_of(meta: dict[str, str], partition: str) -> bool:
    return (
        meta.get(META_PARTITION) == partition
        and meta.get(META_CLASS) == "spot"
        and META_RECLAIM_AT not in meta
    )


def reclaim(folder: Path, base_port: int, server: str, notice_s: float) -> None:
    """Take a server back: announce it `notice_s` ahead (sco drains and deletes it
    itself), or delete it at once as a reclaim without notice."""
    conn = _stack(folder, base_port).conn
    if notice_s > 0:
        deadline = time.time() + notice_s
        r = conn.compute.put(
            f"/servers/{server}/metadata/{META_RECLAIM_AT}",
            json={"meta": {META_RECLAIM_AT: f"{deadline:.0f}"}},
            microversion="2.90",
        )
        what = f"noticed: leave by {utc(deadline)} ({notice_s:.0f} s)"
    else:
        r = conn.compute.delete(f"/servers/{server}", microversion="2.90")
        what = "reclaimed without notice (deleted)"
    if r.status_code >= 300:
        raise SystemExit(f"lab: {server}: HTTP {r.status_code}: {r.text[:200]}")
    print(f"lab: {server} {what}")


def down(folder: Path, base_port: int) -> None:
    if lab_plane.stop(folder):
        print("lab: control plane stopped", file=sys.stderr)
    for what in lab_world.sweep(folder):
        print(f"lab: swept {what} (left by a world that was killed)", file=sys.stderr)
    stack_of(folder, base_port).down()
    print("lab: stopped", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sco_harness.lab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=["up", "down", "servers", "reclaim"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("server", nargs="?")
    parser.add_argument("--notice", type=float, default=0.0, help="seconds of notice (reclaim)")
    parser.add_argument(
        "--partition", help="reclaim: one server of this partition (instead of SERVER)"
    )
    parser.add_argument(
        "--base-port", type=int, default=int(os.environ.get("SCO_OS_BASE_PORT", "18700"))
    )
    parser.add_argument(
        "--http-base",
        type=int,
        default=int(os.environ.get("SCO_LAB_HTTP_BASE", str(lab_plane.BASE))),
        help="sco's ports from here (up)",
    )
    parser.add_argument("--no-plane", action="store_true", help="the cloud alone (up)")
    args = parser.parse_args(argv)
    with stop_on_signals():
        _act(args, parser)


def _act(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    folder = args.folder.resolve()
    if args.action == "up":
        up(folder, args.base_port, args.http_base, not args.no_plane)
    elif args.action == "down":
        down(folder, args.base_port)
    elif args.action == "servers":
        servers(folder, args.base_port)
    else:
        if bool(args.server) == bool(args.partition):
            parser.error("reclaim needs a server id (see `servers`) or --partition")
        server = args.server or _one_of(folder, args.base_port, args.partition)
        reclaim(folder, args.base_port, server, args.notice)


if __name__ == "__main__":
    main()
