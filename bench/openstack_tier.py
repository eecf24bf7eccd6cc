"""Benchmark against real OpenStack services: boot throughput and headroom refresh.

1. Starts the Nova stack (fake virt driver, `scripts/openstack/nova.sh`) with
   four computes of 25 spot slots in two halls, and times the controller from
   its first plan to 100 servers ACTIVE, created in multi-create batches.
2. Bulk-loads 5,000 resource providers into a standalone Placement and times
   a headroom refresh for 3 flavors in 4 aggregates (after the first, which
   also reads aggregate membership).

Prints one JSON line: {"servers_per_s": ..., "headroom_refresh_s": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.openstack import CloudsYamlSecrets, open_provider
from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.placement import PlacementHeadroom, Want, as_nova_schedules
from sco.adapters.openstack.resources import flavor_request
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.adapters.standalone import ServersAsNodes
from sco.decide.acquirer import ActConfig
from sco.decide.policies import policy_named
from sco.engine import builder
from sco.engine.builder import FleetState, Ports
from sco.engine.clock import SystemClock
from sco.engine.cycle import ControllerConfig
from sco.ports import ProviderError, ServerStatus
from sco_harness.openstack_stack import (
    NovaStack,
    free_port,
    generate_providers,
    load_placement,
    placement_down,
    placement_up,
    sdk_connection,
)
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["c1", "c2"], "hall-b": ["c3", "c4"]}
SLOTS = 25


def log(text: str) -> None:
    print(f"[bench/openstack_tier] {text}", file=sys.stderr, flush=True)


def boot_benchmark(folder: Path, servers: int) -> dict[str, Any]:
    base_port = int(os.environ.get("SCO_BENCH_OS_BASE_PORT", "18900"))
    stack = NovaStack(folder, base_port, HALLS, SLOTS)
    t0 = time.monotonic()
    try:
        stack.up()
        computes = sum(map(len, HALLS.values()))
        log(f"stack with {computes} computes up in {time.monotonic() - t0:.1f} s")
        os.environ["OS_CLIENT_CONFIG_FILE"] = str(stack.clouds_yaml)
        conn = stack.conn
        # Only the slot counts: 100 servers fit 4 small fake computes.
        flavor = conn.compute.create_flavor(name="spot.bench", vcpus=1, ram=256, disk=1)
        conn.compute.create_flavor_extra_specs(
            flavor,
            {
                "resources:CUSTOM_SPOT_SLOT": "1",
                "resources:VCPU": "0",
                "resources:MEMORY_MB": "0",
                "resources:DISK_GB": "0",
                "trait:CUSTOM_SPOT_CAPABLE": "required",
            },
        )
        region = RegionSpec.model_validate(
            {
                "region": "bench",
                "image": "cirros-fake",
                "headroom_ttl_s": 2,
                "pools": [
                    {"hall": h, "flavor": "spot.bench", "class": "spot", "price_per_h": 0.1}
                    for h in HALLS
                ],
            }
        )
        clock = SystemClock()
        provider = open_provider(region, "sco-test", CloudsYamlSecrets(), clock)
        provider.discover()
        provider.refresh()
        demand = folder / "demand.yaml"
        demand.write_text(
            yaml.safe_dump(
                {
                    "partitions": [
                        {
                            "name": "bench",
                            "kind": "slurm",
                            "target_units": servers,
                            "max_units": servers,
                        }
                    ]
                }
            )
        )
        ports = Ports(
            provider=provider,
            nodes=ServersAsNodes(provider.last_listing),
            demand=FileDemandSource.load(demand, "bench", clock.now()),
            state=FleetState.of(SqlFleetStore(sqlite_url(folder / "state.sqlite"))),
            clock=clock,
        )
        runner = builder.round_runner(
            ports, lambda: policy_named("sco"), ControllerConfig(act=ActConfig(max_batch=SLOTS))
        )
        started = time.monotonic()
        rounds = list_errors = 0
        while True:
            provider.refresh()
            runner.round()
            rounds += 1
            try:
                listed = [v for v in provider.list("bench") if v.status is ServerStatus.ACTIVE]
            except ProviderError as e:
                list_errors += 1
                log(f"listing failed, as the controller's may: {e}")
                continue
            if len(listed) >= servers:
                break
            if time.monotonic() - started > 600:
                raise SystemExit(f"only {len(listed)} ACTIVE after 600 s")
            time.sleep(0.5)
        took = time.monotonic() - started
        log(f"{servers} servers ACTIVE in {took:.1f} s over {rounds} rounds")
        return {
            "servers": servers,
            "all_active_s": round(took, 2),
            "servers_per_s": round(servers / took, 3),
            "rounds": rounds,
        }
    finally:
        stack.down()


def headroom_benchmark(folder: Path, providers: int, repeats: int) -> dict[str, Any]:
    aggs = [str(uuid.UUID(int=k + 1, version=4)) for k in range(4)]
    spec = folder / "providers.json"
    spec.write_text(json.dumps(generate_providers(providers, aggs, seed=providers)))
    loaded = load_placement(f"sqlite:///{folder / 'placement.sqlite'}", spec)
    try:
        url = placement_up(folder, free_port())
        conn = sdk_connection(url)
        client = CloudClient(lambda _s: conn.placement, SystemClock())
        flavors = {
            "spot": flavor_request(
                2,
                2048,
                10,
                {"resources:CUSTOM_SPOT_SLOT": "1", "trait:CUSTOM_SPOT_CAPABLE": "required"},
            ),
            "guaranteed": flavor_request(4, 8192, 20, {}),
            "bm": flavor_request(
                1,
                1,
                1,
                {
                    "resources:CUSTOM_BAREMETAL_SPOT": "1",
                    "resources:VCPU": "0",
                    "resources:MEMORY_MB": "0",
                    "resources:DISK_GB": "0",
                },
            ),
        }
        wants = [
            Want((name, agg), as_nova_schedules(req), agg)
            for agg in aggs
            for name, req in flavors.items()
        ]
        reader = PlacementHeadroom(client, SystemClock())
        t = time.perf_counter()
        reader.rooms(wants)
        first = time.perf_counter() - t
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            reader.rooms(wants)
            times.append(time.perf_counter() - t)
        log(
            f"{providers} providers loaded in {loaded['seconds']:.1f} s; headroom first "
            f"{first:.2f} s, then {[round(x, 2) for x in times]}"
        )
        return {
            "providers": providers,
            "headroom_refresh_s": round(statistics.median(times), 3),
            "headroom_first_refresh_s": round(first, 3),
            "placement_calls": reader.calls,
            "pools": len(wants),
        }
    finally:
        placement_down(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=100)
    ap.add_argument("--providers", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None, help="Keep stacks' files here.")
    args = ap.parse_args()
    if not 1 <= args.servers <= SLOTS * 4:
        raise SystemExit(f"--servers must be in 1..{SLOTS * 4}")
    with tempfile.TemporaryDirectory(prefix="sco-bench-os-") as tmp:
        root = args.workdir or Path(tmp)
        (root / "nova").mkdir(parents=True, exist_ok=True)
        (root / "placement").mkdir(exist_ok=True)
        result = boot_benchmark(root / "nova", args.servers)
        result.update(headroom_benchmark(root / "placement", args.providers, args.repeats))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    with stop_on_signals():
        main()
