"""10,000 agents long-polling 3 `sco distributor` replicas on PostgreSQL; 1,000
contracts change at once; how fast does every affected agent hear of it?

Starts PostgreSQL, writes 10,000 instances with their contracts and tokens, runs
three `sco distributor` processes (the command users run) and 10,000 simulated
agents in this process: each long-polls `GET /v1/contract?wait=30` with its
ETag, as `sco agent` does, spread over the replicas. Once every agent waits, one
transaction gives 1,000 instances a reclaim notice (their contracts' `drain_by`
changes); propagation is from that commit to each agent receiving the new
version.

Prints one JSON line:
{"agents", "replicas", "propagation_p50_s", "propagation_p99_s", "requests_per_s",
 "errors", "rss_mb_per_replica", ...}
- requests_per_s: requests the replicas answered per second while every agent
  read its contract for the first time (authenticated, one database read each);
- errors: answers other than 200 and 304, and failed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import token_digest
from sco.domain.instances import created, step
from sco.domain.lifecycle import State, Trigger
from sco_harness import services
from sco_harness.builders import instance, spot_pool
from sco_harness.openstack_stack import ROOT, free_port
from sco_harness.postgres import PostgresServer
from sco_harness.services import stop_on_signals

POOL = spot_pool(zone="a")


def log(msg: str) -> None:
    print(f"[bench/distributor] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--changes", type=int, default=1_000)
    ap.add_argument("--wait", type=float, default=30.0, help="Each long poll's seconds.")
    ap.add_argument("--ramp", type=float, default=5.0, help="Agents start over this long.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-bench-dist-") as tmp:
        pg = PostgresServer().start()
        try:
            print(json.dumps(run(Path(tmp), pg.new_database(), args), sort_keys=True))
        finally:
            pg.stop()


def run(folder: Path, url: str, args: argparse.Namespace) -> dict[str, Any]:
    store = SqlFleetStore(url)
    store.upsert_pools([POOL])
    started = time.monotonic()
    instances, tokens = _fleet(store, args.agents)
    took = time.monotonic() - started
    log(f"{args.agents} instances, contracts and tokens written in {took:.1f} s")
    config = folder / "sco.yaml"
    config.write_text(yaml.safe_dump({
        "state": {"url": url},
        "distributor": {"bind": "127.0.0.1", "max_wait_s": args.wait, "poll_s": 2.0,
                        "requests_per_s": 5.0},
        "log": {"level": "warning"},
    }))  # fmt: skip
    ports = [free_port() for _ in range(args.replicas)]
    command = [sys.executable, "-m", "sco.apps.cli", "distributor", "--config", str(config)]
    procs = [
        services.spawn([*command, "--port", str(port)], log=folder / f"dist-{port}.log", cwd=ROOT)
        for port in ports
    ]
    try:
        _wait_ready(ports)
        result = asyncio.run(_agents(store, instances, tokens, ports, args))
        result["rss_mb_per_replica"] = round(max(_rss_mb(p.pid) for p in procs), 1)
        return result
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            services.stop_group(p, signal.SIGTERM, 30)
        store.close()


def _fleet(store: SqlFleetStore, n: int) -> tuple[list[Any], list[str]]:
    instances = [instance(POOL, State.READY) for _ in range(n)]
    for k in range(0, n, 1000):
        store.record([created(i, "bench") for i in instances[k : k + 1000]])
    tokens = [secrets.token_urlsafe(32) for _ in instances]
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE contracts SET token_hash = %(h)s, token_expires_at = 1e12 "
            "WHERE instance_id = %(i)s",
            [{"h": token_digest(t), "i": i.id} for i, t in zip(instances, tokens, strict=True)],
        )
    return instances, tokens


def _wait_ready(ports: list[int]) -> None:
    deadline = time.monotonic() + 60
    for port in ports:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"distributor on :{port} not ready")
            time.sleep(0.2)


async def _agents(
    store: SqlFleetStore,
    instances: list[Any],
    tokens: list[str],
    ports: list[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    n = len(instances)
    timeout = aiohttp.ClientTimeout(total=args.wait + 30, sock_connect=30)
    sessions = [
        aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{p}",
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=timeout,
        )
        for p in ports
    ]
    first: list[float] = []
    got_v2: dict[int, float] = {}
    errors: list[str] = []
    waiting = asyncio.Event()
    stop = asyncio.Event()
    ramp_start = time.monotonic()

    async def agent(k: int) -> None:
        session = sessions[k % len(sessions)]
        headers = {"Authorization": f"Bearer {tokens[k]}"}
        etag: str | None = None
        await asyncio.sleep(random.uniform(0, args.ramp))  # agents do not all boot at once
        while not stop.is_set():
            h = dict(headers, **({"If-None-Match": etag} if etag else {}))
            wait = args.wait if etag else 0
            try:
                async with session.get(f"/v1/contract?wait={wait}", headers=h) as r:
                    status = r.status
                    if status == 200:
                        await r.read()
                        etag = r.headers["ETag"]
            except (aiohttp.ClientError, TimeoutError) as e:
                if not stop.is_set():
                    errors.append(type(e).__name__)
                await asyncio.sleep(1.0)
                continue
            if status == 200:
                if etag == '"1"':
                    first.append(time.monotonic())
                    if len(first) == n:
                        waiting.set()
                else:
                    got_v2.setdefault(k, time.time())
            elif status != 304:
                errors.append(str(status))
                await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(agent(k)) for k in range(n)]
    await asyncio.wait_for(waiting.wait(), 600)
    ramp_s = max(first) - ramp_start
    log(f"every agent read its contract in {ramp_s:.1f} s; all now long-poll")
    await asyncio.sleep(args.wait / 2)  # long polls at every stage of their wait
    chosen = random.Random(7).sample(range(n), args.changes)
    changes = [
        step(instances[k], Trigger.RECLAIM_NOTICE, time.time(), "bench",
             notice_deadline=time.time() + 120)
        for k in chosen
    ]  # fmt: skip
    await asyncio.to_thread(store.record, changes)
    committed = time.time()
    deadline = time.monotonic() + 60
    while len(got_v2) < args.changes and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in sessions:
        await s.close()
    lags = sorted(max(0.0, got_v2[k] - committed) for k in chosen if k in got_v2)
    missing = args.changes - len(lags)
    return {
        "agents": n,
        "replicas": len(ports),
        "changed": args.changes,
        "heard": len(lags),
        "propagation_p50_s": round(statistics.median(lags), 3) if lags else None,
        "propagation_p99_s": round(lags[min(len(lags) - 1, int(0.99 * len(lags)))], 3)
        if lags
        else None,
        "propagation_max_s": round(lags[-1], 3) if lags else None,
        "requests_per_s": round(n / ramp_s, 1),
        "errors": len(errors) + missing,
        "error_kinds": sorted(set(errors))[:5],
    }


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with stop_on_signals():
        main()
