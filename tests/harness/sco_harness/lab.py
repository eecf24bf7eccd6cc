"""A local OpenStack to try sco on: `make lab` (and `make lab-down`).

    python -m sco_harness.lab up DIR [--base-port N]   start it, write DIR/sco.yaml
    python -m sco_harness.lab servers DIR              what sco holds there
    python -m sco_harness.lab reclaim DIR SERVER [--notice S]
                                                       take a spot server back, as a
                                                       cloud operator would (with a notice
                                                       of S seconds, or at once)
    python -m sco_harness.lab down DIR

`up` starts Nova (fake virt driver, four computes), Placement, Glance and
Neutron's API on loopback (`scripts/openstack/nova.sh`), creates a spot and a
guaranteed flavor and two halls (host aggregates that are availability
zones), writes what sco needs to run on it: `clouds.yaml`, `region.yaml`
and `sco.yaml` (embedded defaults: SQLite state and event log, chDB history),
with two partitions; then starts sco's control plane on it under a supervisor
(`sco_harness.lab_plane`: two `sco run` replicas, `sco watch`, `sco history load`
scoring, `sco distributor`, `sco status`; one log, `lab.log`) and prints where
everything answers. `--no-plane` starts the cloud alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from sco_harness import lab_plane
from sco_harness.openstack_stack import NovaStack
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"]}
SLOTS = 4
CLOUD = "sco-test"
META_RECLAIM_AT = "sco:reclaim-at"


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
        },
        "partitions": [
            {
                "name": "web",
                "kind": "kubernetes",
                "target_units": 3,
                "floor_units": 2,
                "max_units": 6,
            },
            {"name": "batch", "kind": "slurm", "target_units": 4, "floor_units": 0, "max_units": 8},
        ],
        "policy": {"name": "sco", "interval_s": 5},
        "http": lab_plane.http_section(http_base),
        "distributor": {"port": lab_plane.ports(http_base)["distributor"]},
        "log": {"level": "info", "format": "text"},
    }


def up(folder: Path, base_port: int, http_base: int, plane: bool) -> None:
    if lab_plane.running(folder):
        raise SystemExit(f"lab: already up in {folder} (make lab-down first)")
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # Interrupted (Ctrl-C, SIGTERM) before it is written out, the stack is stopped;
    # once it is, it is the user's until `lab down`.
    stack = NovaStack(folder / "stack", base_port, HALLS, SLOTS).up()
    print(
        f"lab: Nova, Placement, Glance and Neutron up in {time.monotonic() - started:.0f} s; "
        f"{sum(len(h) for h in HALLS.values())} computes in {len(HALLS)} halls, "
        f"{SLOTS} spot slots each",
        file=sys.stderr,
    )
    region = stack.region()
    (folder / "region.yaml").write_text(yaml.safe_dump(region, sort_keys=False))
    (folder / "clouds.yaml").write_text(stack.clouds_yaml.read_text())
    (folder / "sco.yaml").write_text(
        "# sco on the local test stack (make lab): embedded state, log and history.\n"
        + yaml.safe_dump(sco_yaml(http_base), sort_keys=False)
    )
    if plane:
        lab_plane.start(folder, http_base)
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


def _stack(folder: Path, base_port: int) -> NovaStack:
    stack = NovaStack(folder / "stack", base_port, HALLS, SLOTS)
    stack.connect()
    return stack


def servers(folder: Path, base_port: int) -> None:
    for s in _stack(folder, base_port).servers(tags="sco"):
        meta = s.get("metadata") or {}
        print(
            f"{s['id']}  {s['status']:<7} {meta.get('sco:partition', '?'):<10} "
            f"{meta.get('sco:class', '?'):<10} {s.get('OS-EXT-AZ:availability_zone', '?'):<7} "
            f"{meta.get(META_RECLAIM_AT, '')}"
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
        what = f"noticed: leave by {deadline:.0f} ({notice_s:.0f} s)"
    else:
        r = conn.compute.delete(f"/servers/{server}", microversion="2.90")
        what = "reclaimed without notice (deleted)"
    if r.status_code >= 300:
        raise SystemExit(f"lab: {server}: HTTP {r.status_code}: {r.text[:200]}")
    print(f"lab: {server} {what}")


def down(folder: Path, base_port: int) -> None:
    if lab_plane.stop(folder):
        print("lab: control plane stopped", file=sys.stderr)
    NovaStack(folder / "stack", base_port, HALLS, SLOTS).down()
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
        "--base-port", type=int, default=int(os.environ.get("SCO_OS_BASE_PORT", "18700"))
    )
    parser.add_argument(
        "--http-base", type=int, default=lab_plane.BASE, help="sco's ports from here (up)"
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
        if not args.server:
            parser.error("reclaim needs a server id (see `servers`)")
        reclaim(folder, args.base_port, args.server, args.notice)


if __name__ == "__main__":
    main()
