"""The checks of placement_check.py: what a real Placement must answer for the
providers it loaded, asked through Placement's HTTP API.

Each `check` counts in PASSED or FAILED (and logs a failure on stderr);
placement_check.py prints the totals and exits 1 if any failed.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from typing import Any

import requests

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
AGGS = [str(uuid.UUID(int=0xA66 << 64 | i)) for i in range(4)]
AC_QUERY = (
    "resources=VCPU:1,MEMORY_MB:512,CUSTOM_SPOT_SLOT:1"
    "&required=CUSTOM_SPOT_CAPABLE,!COMPUTE_STATUS_DISABLED&member_of={agg}"
)

FAILED: list[str] = []
PASSED: list[str] = []


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check(ok: bool, what: str) -> None:
    if ok:
        PASSED.append(what)
    else:
        FAILED.append(what)
        log(f"FAIL: {what}")


def capacity(inv: dict[str, Any]) -> int:
    return int((inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0))


def expected_ac(spec: list[dict[str, Any]], agg: str) -> set[str]:
    want = {"VCPU": 1, "MEMORY_MB": 512, "CUSTOM_SPOT_SLOT": 1}
    res = set()
    for p in spec:
        if agg not in p["aggregates"] or "CUSTOM_SPOT_CAPABLE" not in p["traits"]:
            continue
        if "COMPUTE_STATUS_DISABLED" in p["traits"]:
            continue
        ok = True
        for rc, amount in want.items():
            inv = p["inventories"].get(rc)
            if inv is None:
                ok = False
                break
            used = p.get("usages", {}).get(rc, 0)
            if (
                capacity(inv) - used < amount
                or not inv.get("min_unit", 1) <= amount <= inv.get("max_unit", 2**31 - 1)
                or amount % inv.get("step_size", 1)
            ):
                ok = False
                break
        if ok:
            res.add(p["uuid"])
    return res


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        self.s = requests.Session()
        self.s.headers.update(HEADERS)

    def req(self, method: str, path: str, expect: int = 200, **kw: Any) -> Any:
        r = self.s.request(method, self.url + path, timeout=120, **kw)
        if r.status_code != expect:
            raise RuntimeError(f"{method} {path}: {r.status_code} (want {expect}): {r.text[:500]}")
        return r.json() if r.content else None

    def get(self, path: str) -> Any:
        return self.req("GET", path)


def check_provider(api: Api, p: dict[str, Any], tag: str) -> None:
    u = p["uuid"]
    inv = api.get(f"/resource_providers/{u}/inventories")["inventories"]
    want_inv = {
        rc: {
            "reserved": 0,
            "min_unit": 1,
            "max_unit": 2147483647,
            "step_size": 1,
            "allocation_ratio": 1.0,
            **v,
        }
        for rc, v in p["inventories"].items()
    }
    check(inv == want_inv, f"{tag}: inventories of {u}: {inv} != {want_inv}")
    usages = api.get(f"/resource_providers/{u}/usages")["usages"]
    want_use = {rc: p.get("usages", {}).get(rc, 0) for rc in p["inventories"]}
    check(usages == want_use, f"{tag}: usages of {u}: {usages} != {want_use}")
    traits = api.get(f"/resource_providers/{u}/traits")["traits"]
    check(sorted(traits) == sorted(p["traits"]), f"{tag}: traits of {u}: {traits}")
    aggs = api.get(f"/resource_providers/{u}/aggregates")["aggregates"]
    check(sorted(aggs) == sorted(p["aggregates"]), f"{tag}: aggregates of {u}: {aggs}")
    rp = api.get(f"/resource_providers/{u}")
    check(
        rp["name"] == p["name"]
        and rp["root_provider_uuid"] == u
        and rp["parent_provider_uuid"] is None,
        f"{tag}: provider record of {u}: {rp}",
    )


def check_ac(api: Api, spec: list[dict[str, Any]], agg: str, tag: str) -> None:
    by_uuid = {p["uuid"]: p for p in spec}
    ac = api.get("/allocation_candidates?" + AC_QUERY.format(agg=agg))
    got = {next(iter(a["allocations"])) for a in ac["allocation_requests"]}
    want = expected_ac(spec, agg)
    check(
        len(want) > 0 and got == want,
        f"{tag}: allocation_candidates: got {len(got)}, want {len(want)}, diff {len(got ^ want)}",
    )
    check(set(ac["provider_summaries"]) == want, f"{tag}: provider_summaries keys")
    bad = 0
    for u, summ in ac["provider_summaries"].items():
        p = by_uuid.get(u)
        if p is None:
            bad += 1
            continue
        want_res = {
            rc: {"capacity": capacity(inv), "used": p.get("usages", {}).get(rc, 0)}
            for rc, inv in p["inventories"].items()
        }
        if summ["resources"] != want_res or sorted(summ["traits"]) != sorted(p["traits"]):
            bad += 1
            if bad <= 3:
                log(f"  summary mismatch {u}: {summ} vs {want_res}")
    check(bad == 0, f"{tag}: {bad} provider_summaries differ from the spec")
    log(f"  {tag}: allocation_candidates member_of={agg[:8]}…: {len(got)} candidates as expected")


def p50_ac(api: Api, agg: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        api.get("/allocation_candidates?" + AC_QUERY.format(agg=agg))
        times.append(time.monotonic() - t0)
    return round(statistics.median(times) * 1000, 1)


def api_writes(api: Api, spec: list[dict[str, Any]], tag: str) -> None:
    # New provider with inventories, a new custom RC and trait.
    new = str(uuid.uuid4())
    rp = api.req("POST", "/resource_providers", 200, json={"uuid": new, "name": f"api-{new[:8]}"})
    check(rp["generation"] == 0, f"{tag}: new RP generation {rp['generation']}")
    api.req("POST", "/resource_classes", 201, json={"name": "CUSTOM_API_MADE"})
    rcs = {r["name"] for r in api.get("/resource_classes")["resource_classes"]}
    check(
        {"VCPU", "CUSTOM_SPOT_SLOT", "CUSTOM_API_MADE"} <= rcs, f"{tag}: resource classes listing"
    )
    inv = api.req(
        "PUT",
        f"/resource_providers/{new}/inventories",
        200,
        json={
            "resource_provider_generation": 0,
            "inventories": {
                "VCPU": {"total": 8},
                "CUSTOM_SPOT_SLOT": {"total": 2},
                "CUSTOM_API_MADE": {"total": 1},
            },
        },
    )
    check(inv["resource_provider_generation"] == 1, f"{tag}: new RP generation after inventories")
    api.req("PUT", "/traits/CUSTOM_API_TRAIT", 201)
    api.req(
        "PUT",
        f"/resource_providers/{new}/traits",
        200,
        json={
            "resource_provider_generation": 1,
            "traits": ["CUSTOM_API_TRAIT", "CUSTOM_SPOT_CAPABLE"],
        },
    )
    api.req(
        "PUT",
        f"/resource_providers/{new}/aggregates",
        200,
        json={"resource_provider_generation": 2, "aggregates": [AGGS[0]]},
    )

    # POST /allocations on a loaded provider (one with usages and spot), using its generation.
    loaded = next(
        p
        for p in spec
        if "usages" in p
        and "CUSTOM_SPOT_SLOT" in p["inventories"]
        and p["usages"].get("CUSTOM_SPOT_SLOT", 0) < 8
    )
    u = loaded["uuid"]
    gen = api.get(f"/resource_providers/{u}")["generation"]
    consumer = str(uuid.uuid4())
    api.req(
        "POST",
        "/allocations",
        204,
        json={
            consumer: {
                "allocations": {
                    u: {"resources": {"VCPU": 2, "CUSTOM_SPOT_SLOT": 1}},
                    new: {"resources": {"CUSTOM_API_MADE": 1}},
                },
                "project_id": "p-check",
                "user_id": "u-check",
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            }
        },
    )
    gen2 = api.get(f"/resource_providers/{u}")["generation"]
    check(gen2 == gen + 1, f"{tag}: loaded RP generation {gen} -> {gen2} after POST /allocations")
    usages = api.get(f"/resource_providers/{u}/usages")["usages"]
    check(
        usages["VCPU"] == loaded["usages"]["VCPU"] + 2
        and usages["CUSTOM_SPOT_SLOT"] == loaded["usages"]["CUSTOM_SPOT_SLOT"] + 1,
        f"{tag}: usages after POST /allocations: {usages}",
    )

    # The loaded consumer: visible, generation 1, and writable with that generation.
    allocs = api.get(f"/resource_providers/{u}/allocations")
    loaded_consumers = [c for c in allocs["allocations"] if c != consumer]
    check(len(loaded_consumers) == 1, f"{tag}: loaded RP consumers: {list(allocs['allocations'])}")
    lc = loaded_consumers[0]
    ca = api.get(f"/allocations/{lc}")
    check(
        ca["consumer_generation"] == 1
        and ca["consumer_type"] == "unknown"
        and ca["project_id"] == "sco-placement-load"
        and ca["allocations"][u]["resources"] == loaded["usages"]
        and ca["allocations"][u]["generation"] == gen2,
        f"{tag}: loaded consumer {lc}: {ca}",
    )
    shrunk = dict(loaded["usages"])
    shrunk["VCPU"] = 1
    api.req(
        "PUT",
        f"/allocations/{lc}",
        204,
        json={
            "allocations": {u: {"resources": shrunk}},
            "project_id": ca["project_id"],
            "user_id": ca["user_id"],
            "consumer_generation": 1,
            "consumer_type": "INSTANCE",
        },
    )
    ca2 = api.get(f"/allocations/{lc}")
    check(
        ca2["consumer_generation"] == 2 and ca2["allocations"][u]["resources"]["VCPU"] == 1,
        f"{tag}: loaded consumer after PUT: {ca2}",
    )
    # A stale provider generation is refused (generations are really checked).
    r = api.s.put(
        f"{api.url}/resource_providers/{u}/traits",
        timeout=60,
        json={"resource_provider_generation": gen, "traits": ["CUSTOM_SPOT_CAPABLE"]},
    )
    check(r.status_code == 409, f"{tag}: stale generation PUT traits gave {r.status_code}")
    gen3 = api.get(f"/resource_providers/{u}")["generation"]
    api.req(
        "PUT",
        f"/resource_providers/{u}/traits",
        200,
        json={
            "resource_provider_generation": gen3,
            "traits": loaded["traits"] + ["CUSTOM_API_TRAIT"],
        },
    )
    # Delete the API consumer: usages return to the loaded values (+ the PUT change).
    api.req("DELETE", f"/allocations/{consumer}", 204)
    usages = api.get(f"/resource_providers/{u}/usages")["usages"]
    check(
        usages["VCPU"] == 1 and usages["CUSTOM_SPOT_SLOT"] == loaded["usages"]["CUSTOM_SPOT_SLOT"],
        f"{tag}: usages after DELETE: {usages}",
    )
    proj = api.get("/usages?project_id=sco-placement-load")["usages"]
    want_vcpu = sum(p.get("usages", {}).get("VCPU", 0) for p in spec) - loaded["usages"]["VCPU"] + 1
    # 1.38+: grouped by consumer type; loaded consumers have none ("unknown"),
    # the one PUT above made INSTANCE.
    n_cons = sum(1 for p in spec if p.get("usages"))
    check(
        proj.get("unknown", {}).get("consumer_count") == n_cons - 1
        and sum(t.get("VCPU", 0) for t in proj.values()) == want_vcpu,
        f"{tag}: project usages {proj} != VCPU {want_vcpu}, {n_cons} consumers",
    )
    log(f"  {tag}: API writes on loaded data OK")
