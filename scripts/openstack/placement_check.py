"""Verify placement_load.py against a real standalone Placement (placement.sh).

    export SCO_OPENSTACK_VENV=/path/venv
    $SCO_OPENSTACK_VENV/bin/python placement_check.py [--sizes 1000,5000] [--keep]

For each size N: generate N providers (4 aggregates, half with
CUSTOM_SPOT_SLOT inventory and trait CUSTOM_SPOT_CAPABLE, 1 in 50
COMPUTE_STATUS_DISABLED, every third with usages), load them into a fresh DB
while Placement is stopped, start Placement, then check through the HTTP API:
provider count; inventories/usages/traits/aggregates of 50 sampled providers;
an allocation_candidates query (exact provider set and provider_summaries'
capacity/used); loading more providers (with a new custom resource class,
trait and aggregate) into the running Placement; and normal API writes
(create RP, PUT inventories, traits, aggregates, custom RC; POST /allocations
on a loaded RP; PUT allocations of a loaded consumer with its generation).
Prints progress on stderr and one JSON line of timings on stdout; exits 1 if a
check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capacity(inv: dict[str, Any]) -> int:
    return int((inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0))


def gen_spec(
    n: int,
    seed: int,
    prefix: str,
    extra_rc: str | None = None,
    extra_trait: str | None = None,
    extra_agg: str | None = None,
) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        spot = i % 2 == 0
        invs: dict[str, Any] = {
            "VCPU": {
                "total": 64,
                "reserved": 0,
                "allocation_ratio": 4.0,
                "min_unit": 1,
                "max_unit": 64,
                "step_size": 1,
            },
            "MEMORY_MB": {
                "total": 262144,
                "reserved": 2048,
                "allocation_ratio": 1.0,
                "min_unit": 1,
                "max_unit": 262144,
                "step_size": 1,
            },
            "DISK_GB": {
                "total": 2000,
                "reserved": 0,
                "allocation_ratio": 1.0,
                "min_unit": 1,
                "max_unit": 2000,
                "step_size": 1,
            },
        }
        traits = ["HW_CPU_X86_AVX2"]
        if spot:
            invs["CUSTOM_SPOT_SLOT"] = {
                "total": 8,
                "reserved": 0,
                "allocation_ratio": 1.0,
                "min_unit": 1,
                "max_unit": 8,
                "step_size": 1,
            }
            traits.append("CUSTOM_SPOT_CAPABLE")
        if i % 50 == 7:
            traits.append("COMPUTE_STATUS_DISABLED")
        if extra_trait:
            traits.append(extra_trait)
        if extra_rc:
            invs[extra_rc] = {"total": 4}
        aggs = [AGGS[(i // 2) % 4]]
        if i % 7 == 0:
            aggs.append(AGGS[(i // 2 + 1) % 4])
        if extra_agg:
            aggs.append(extra_agg)
        p: dict[str, Any] = {
            "uuid": str(uuid.UUID(int=rnd.getrandbits(128), version=4)),
            "name": f"{prefix}-{i:05d}",
            "inventories": invs,
            "traits": traits,
            "aggregates": aggs,
        }
        if i % 3 == 0:
            u: dict[str, int] = {"VCPU": 4 * (1 + i % 5), "MEMORY_MB": 8192, "DISK_GB": 40}
            if i % 15 == 0:  # memory almost full: 256 MB left
                u["MEMORY_MB"] = capacity(invs["MEMORY_MB"]) - 256
            if spot:
                u["CUSTOM_SPOT_SLOT"] = 8 if i % 9 == 0 else 1 + i % 3  # 8 = full
            if extra_rc:
                u[extra_rc] = 1
            p["usages"] = u
        out.append(p)
    return out


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


def sh(*args: str) -> str:
    r = subprocess.run(
        ["bash", os.path.join(HERE, "placement.sh"), *args],
        check=False,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"placement.sh {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def load(db: str, spec: list[dict[str, Any]], workdir: str, tag: str) -> dict[str, Any]:
    path = os.path.join(workdir, f"spec-{tag}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "placement_load.py"), db, path],
        check=False,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"placement_load failed: {r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = round(wall, 3)
    check(out["providers"] == len(spec), f"{tag}: loader reported {out['providers']} providers")
    return dict(out)


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


def scenario(n: int, workdir: str, timings: dict[str, Any]) -> None:
    tag = f"{n // 1000}k" if n % 1000 == 0 else str(n)
    d = os.path.join(workdir, tag)
    os.makedirs(d)
    db = f"sqlite:///{d}/placement.sqlite"
    port = free_port()
    spec = gen_spec(n, seed=n, prefix=f"cn{tag}")
    url = ""
    try:
        # Schema only (db sync) while stopped: placement.sh up + down would also
        # sync, but a bare db sync is what a test fixture would do.
        conf = os.path.join(d, "placement.conf")
        with open(conf, "w") as f:
            f.write(f"[placement_database]\nconnection = {db}\n")
        t0 = time.monotonic()
        subprocess.run(
            [
                os.path.join(os.environ["SCO_OPENSTACK_VENV"], "bin", "placement-manage"),
                "--config-file",
                conf,
                "db",
                "sync",
            ],
            check=True,
            capture_output=True,
        )
        timings[f"db_sync_{tag}_s"] = round(time.monotonic() - t0, 2)
        lr = load(db, spec, workdir, tag)
        timings[f"load_{tag}_s"] = lr["seconds"]
        timings[f"load_{tag}_wall_s"] = lr["wall_seconds"]
        log(f"{tag}: loaded {n} providers while stopped: {lr}")

        t0 = time.monotonic()
        url = sh("up", d, str(port))
        timings[f"start_{tag}_s"] = round(time.monotonic() - t0, 2)
        log(f"{tag}: placement up at {url} in {timings[f'start_{tag}_s']} s")
        api = Api(url)

        rps = api.get("/resource_providers")["resource_providers"]
        check(len(rps) == n, f"{tag}: GET /resource_providers count {len(rps)} != {n}")
        by_uuid = {r["uuid"]: r for r in rps}
        check(
            all(
                by_uuid[p["uuid"]]["generation"]
                == sum(1 for k in ("inventories", "traits", "aggregates", "usages") if p.get(k))
                for p in spec
            ),
            f"{tag}: provider generations",
        )
        for p in random.Random(1).sample(spec, 50):
            check_provider(api, p, tag)
        log(f"  {tag}: count {len(rps)}, 50 sampled providers match the spec")
        for agg in AGGS:
            check_ac(api, spec, agg, tag)
        api.get("/allocation_candidates?" + AC_QUERY.format(agg=AGGS[0]))  # warm
        timings[f"ac_p50_{tag}_ms"] = p50_ac(api, AGGS[0], 15 if n <= 1000 else 9)
        log(f"  {tag}: allocation_candidates p50 {timings[f'ac_p50_{tag}_ms']} ms")

        # Load more providers into the RUNNING Placement, with a custom RC, trait
        # and aggregate it has never seen.
        new_agg = str(uuid.uuid4())
        extra = gen_spec(
            200,
            seed=n + 1,
            prefix=f"live{tag}",
            extra_rc="CUSTOM_LIVE_RC",
            extra_trait="CUSTOM_LIVE_TRAIT",
            extra_agg=new_agg,
        )
        lr = load(db, extra, workdir, tag + "-live")
        timings[f"load_live_200_into_{tag}_s"] = lr["seconds"]
        rps = api.get("/resource_providers")["resource_providers"]
        check(len(rps) == n + len(extra), f"{tag}: count after live load {len(rps)}")
        for p in random.Random(2).sample(extra, 20):
            check_provider(api, p, tag + "-live")
        for agg in (AGGS[1], new_agg):
            check_ac(api, spec + extra, agg, tag + "-live")
        live = api.get(
            "/allocation_candidates?resources=CUSTOM_LIVE_RC:1&required=CUSTOM_LIVE_TRAIT"
            f"&member_of={new_agg}"
        )
        want_live = {p["uuid"] for p in extra}  # total 4, used <= 1
        check(
            {next(iter(a["allocations"])) for a in live["allocation_requests"]} == want_live,
            f"{tag}-live: candidates for the live custom RC",
        )
        log(f"  {tag}: loaded 200 more into the running Placement: visible at once")

        api_writes(api, spec + extra, tag)
    finally:
        if url or os.path.exists(os.path.join(d, "placement.pid")):
            sh("down", d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    os.environ.setdefault("SCO_OPENSTACK_VENV", sys.prefix)
    workdir = tempfile.mkdtemp(prefix="placement-check-")
    timings: dict[str, Any] = {}
    try:
        for n in [int(x) for x in args.sizes.split(",")]:
            scenario(n, workdir, timings)
    except Exception as e:  # report, still print what we have
        FAILED.append(f"error: {e}")
        log(f"ERROR: {e}")
    finally:
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(timings))
    log(f"checks: {len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
