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
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from placement_check_api import (
    AC_QUERY,
    AGGS,
    FAILED,
    PASSED,
    Api,
    api_writes,
    capacity,
    check,
    check_ac,
    check_provider,
    log,
    p50_ac,
)

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
