"""Headroom from a real Placement service (openstack-placement, SQLite, noauth2).

Small topologies are built through Placement's API; 1,000 and 5,000
resource providers are bulk-loaded into its database by the project's
loader, then read back through the API. Expected headroom is computed here
from the same provider list, independently of the adapter.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.placement import PlacementHeadroom, Want, as_nova_schedules
from sco.adapters.openstack.resources import ResourceRequest, flavor_request
from sco.engine.clock import SystemClock
from sco_harness.openstack_stack import (
    echo,
    free_port,
    generate_providers,
    load_placement,
    placement_down,
    placement_up,
    sdk_connection,
)

SPOT = as_nova_schedules(
    flavor_request(
        2,
        2048,
        10,
        {"resources:CUSTOM_SPOT_SLOT": "1", "trait:CUSTOM_SPOT_CAPABLE": "required"},
    )
)
GUARANTEED = as_nova_schedules(
    flavor_request(4, 8192, 20, {"trait:CUSTOM_SPOT_CAPABLE": "forbidden"})
)
BAREMETAL = as_nova_schedules(
    flavor_request(
        32,
        262144,
        900,
        {
            "resources:CUSTOM_BAREMETAL_SPOT": "1",
            "resources:VCPU": "0",
            "resources:MEMORY_MB": "0",
            "resources:DISK_GB": "0",
            "trait:CUSTOM_SPOT_CAPABLE": "required",
        },
    )
)


@dataclass
class Placement:
    url: str
    client: CloudClient


@pytest.fixture(scope="module")
def placement_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("placement")
    yield folder
    placement_down(folder)


def _start(folder: Path) -> Placement:
    url = placement_up(folder, free_port())
    conn = sdk_connection(url)
    return Placement(url, CloudClient(lambda _s: conn.placement, SystemClock()))


# ---------------------------------------------------------------- expected


def _capacity(inv: dict[str, Any]) -> int:
    return int((inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0))


def expected(providers: list[dict[str, Any]], request: ResourceRequest, agg: str) -> int:
    total = 0
    for p in providers:
        traits = set(p.get("traits", []))
        if agg not in p.get("aggregates", []):
            continue
        if not request.required <= traits or request.forbidden & traits:
            continue
        fits = None
        for rc, amount in request.resources.items():
            inv = p["inventories"].get(rc)
            if inv is None or amount > inv.get("max_unit", inv["total"]):
                fits = 0
                break
            free = _capacity(inv) - p.get("usages", {}).get(rc, 0)
            n = max(free, 0) // amount
            fits = n if fits is None else min(fits, n)
        total += fits or 0
    return total


# ---------------------------------------------------------------- generated providers


@pytest.mark.parametrize("n", [1000, 5000])
def test_headroom_at_scale(n: int, tmp_path: Path) -> None:
    aggs = [str(uuid.UUID(int=k + 1, version=4)) for k in range(4)]
    providers = generate_providers(n, aggs, seed=n)
    spec = tmp_path / "providers.json"
    spec.write_text(json.dumps(providers))
    loaded = load_placement(f"sqlite:///{tmp_path / 'placement.sqlite'}", spec)
    assert loaded["providers"] == n
    try:
        placement = _start(tmp_path)
        wants = [
            Want((name, agg), req, agg)
            for agg in aggs
            for name, req in (("spot", SPOT), ("guaranteed", GUARANTEED), ("bm", BAREMETAL))
        ]
        reader = PlacementHeadroom(placement.client, SystemClock())
        started = time.perf_counter()
        rooms = reader.rooms(wants)
        took = time.perf_counter() - started
        assert reader.calls == 3 + len(aggs)  # a call per flavor, one per aggregate
        started = time.perf_counter()
        assert reader.rooms(wants) == rooms
        again = time.perf_counter() - started
        assert reader.calls == 3  # membership is kept
        for w in wants:
            assert w.member_of is not None
            assert rooms[w.key] == expected(providers, w.request, w.member_of), w.key
        assert sum(rooms.values()) > 0
        echo(
            f"placement {n} providers: load {loaded['seconds']:.1f} s, headroom {took:.2f} s "
            f"first, {again:.2f} s refresh"
        )
    finally:
        placement_down(tmp_path)


# ---------------------------------------------------------------- built through the API


def _api(client: CloudClient, method: str, path: str, body: Any = None) -> Any:
    if method == "PUT":
        return client.put("placement", path, body)
    if method == "POST":
        return client.post("placement", path, body)
    return client.get("placement", path)


def test_headroom_follows_api_changes(placement_dir: Path) -> None:
    """Aggregates, traits, custom classes and allocations made through the API,
    and headroom after each change."""
    p = _start(placement_dir)
    c = p.client
    agg_a, agg_b = str(uuid.uuid4()), str(uuid.uuid4())
    for rc in ("CUSTOM_SPOT_SLOT", "CUSTOM_BAREMETAL_SPOT"):
        _api(c, "PUT", f"/resource_classes/{rc}")
    _api(c, "PUT", "/traits/CUSTOM_SPOT_CAPABLE")
    rps: dict[str, str] = {}

    def provider(name: str, inv: dict[str, int], traits: list[str], agg: str) -> str:
        rp = _api(c, "POST", "/resource_providers", {"name": name})
        rid = rp["uuid"]
        gen = rp["generation"]
        body = {
            "resource_provider_generation": gen,
            "inventories": {k: {"total": v, "max_unit": v} for k, v in inv.items()},
        }
        gen = _api(c, "PUT", f"/resource_providers/{rid}/inventories", body)[
            "resource_provider_generation"
        ]
        gen = _api(
            c,
            "PUT",
            f"/resource_providers/{rid}/traits",
            {"resource_provider_generation": gen, "traits": traits},
        )["resource_provider_generation"]
        _api(
            c,
            "PUT",
            f"/resource_providers/{rid}/aggregates",
            {"resource_provider_generation": gen, "aggregates": [agg]},
        )
        rps[name] = rid
        return rid

    std = {"VCPU": 16, "MEMORY_MB": 32768, "DISK_GB": 200}
    provider("a1", {**std, "CUSTOM_SPOT_SLOT": 4}, ["CUSTOM_SPOT_CAPABLE"], agg_a)
    provider("a2", {**std, "CUSTOM_SPOT_SLOT": 4}, ["CUSTOM_SPOT_CAPABLE"], agg_a)
    provider("a3", std, [], agg_a)
    provider("b1", {**std, "CUSTOM_SPOT_SLOT": 2}, ["CUSTOM_SPOT_CAPABLE"], agg_b)
    provider("bm1", {"CUSTOM_BAREMETAL_SPOT": 1}, ["CUSTOM_SPOT_CAPABLE"], agg_b)
    provider("bm2", {"CUSTOM_BAREMETAL_SPOT": 1}, ["CUSTOM_SPOT_CAPABLE"], agg_b)

    reader = PlacementHeadroom(c, SystemClock(), membership_ttl_s=0)

    def rooms() -> dict[object, int]:
        wants = [
            Want("spot-a", SPOT, agg_a),
            Want("spot-b", SPOT, agg_b),
            Want("guaranteed-a", GUARANTEED, agg_a),
            Want("bm-b", BAREMETAL, agg_b),
        ]
        return reader.rooms(wants)

    # spot: 4 + 4 slots in a (vCPU 16/2 = 8 each is not binding); 2 in b.
    # guaranteed forbids the spot trait: only a3, vCPU 16/4 = 4.
    assert rooms() == {"spot-a": 8, "spot-b": 2, "guaranteed-a": 4, "bm-b": 2}

    # A server takes a slot on a1 and a bare-metal node is taken.
    for rid, res in (
        (rps["a1"], {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10, "CUSTOM_SPOT_SLOT": 1}),
        (rps["bm1"], {"CUSTOM_BAREMETAL_SPOT": 1}),
    ):
        consumer = str(uuid.uuid4())
        _api(
            c,
            "PUT",
            f"/allocations/{consumer}",
            {
                "allocations": {rid: {"resources": res}},
                "project_id": str(uuid.uuid4()),
                "user_id": str(uuid.uuid4()),
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
    assert rooms() == {"spot-a": 7, "spot-b": 2, "guaranteed-a": 4, "bm-b": 1}

    # a2 is disabled (Nova sets this trait): the scheduler will not use it.
    gen = _api(c, "GET", f"/resource_providers/{rps['a2']}")["generation"]
    _api(
        c,
        "PUT",
        f"/resource_providers/{rps['a2']}/traits",
        {
            "resource_provider_generation": gen,
            "traits": ["CUSTOM_SPOT_CAPABLE", "COMPUTE_STATUS_DISABLED"],
        },
    )
    assert rooms()["spot-a"] == 3
