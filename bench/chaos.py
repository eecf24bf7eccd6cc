"""Chaos: `sco run` replicas killed with SIGKILL while they share partitions.

Starts PostgreSQL and the Nova stack (fake computes, two halls), then three
`sco run` replicas over twelve partitions of one spot server each. For a fixed
time it kills a random replica every few seconds and starts a new one (a new
name: a restarted process is a new replica). Then it lets the survivors
settle, stops them, and checks the cloud against the fleet state.

Prints one JSON line:
{"kills", "duplicate_creates", "leaked_servers", "max_takeover_s", "lost_transitions", ...}
- duplicate_creates: servers beyond their request's records (a request id sent twice);
- leaked_servers: servers with no live record once settled;
- max_takeover_s: from a kill to every partition it held being held by another replica;
- lost_transitions: breaks in any instance's history chain, or a record whose state
  is not its last history row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, text

from sco_harness import services
from sco_harness.chaos import audit
from sco_harness.openstack_stack import NovaStack
from sco_harness.postgres import PostgresServer
from sco_harness.services import stop_on_signals

PARTITIONS = 12


def log(msg: str) -> None:
    print(f"[bench/chaos] {msg}", file=sys.stderr, flush=True)


class Replicas:
    def __init__(self, folder: Path, args: list[str], env: dict[str, str]) -> None:
        self.folder = folder
        self.args = args
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0

    def start(self) -> str:
        self.started += 1
        name = f"replica-{self.started}"
        # Several replicas on one host: no metrics port each.
        args = [*self.args, "--replica", name, "--metrics-port", "0"]
        self.procs[name] = services.spawn(
            [sys.executable, "-m", "sco.apps.cli", "-v", "run", *args],
            log=self.folder / f"{name}.log",
            env=self.env,
        )
        return name

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)  # all at once: each hands its leases over
        for p in self.procs.values():
            services.stop_group(p, signal.SIGTERM, 60)
        self.procs.clear()


class Takeovers:
    """Watches the leases table: when does each killed replica's work have a new holder?"""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.pending: list[tuple[str, float, set[str]]] = []
        self.done: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def held_by(self, name: str) -> set[str]:
        now = time.time()
        with self.engine.connect() as c:
            rows = c.execute(
                text("SELECT partition FROM leases WHERE holder = :h AND expires_at >= :n"),
                {"h": name, "n": now},
            )
            return {r.partition for r in rows}

    def killed(self, name: str, at: float, held: set[str]) -> None:
        if held:
            self.pending.append((name, at, held))

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            now = time.time()
            try:
                with self.engine.connect() as c:
                    holders = {
                        r.partition: r.holder
                        for r in c.execute(
                            text("SELECT partition, holder FROM leases WHERE expires_at >= :n"),
                            {"n": now},
                        )
                    }
            except Exception as e:  # before the first replica migrated the schema
                log(f"leases not readable yet: {type(e).__name__}")
                continue
            still = []
            for name, at, held in self.pending:
                if all(holders.get(p) not in (None, name) for p in held):
                    self.done.append(now - at)
                else:
                    still.append((name, at, held))
            self.pending = still

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


reclaimed = [0]


def reclaim(stack: NovaStack, every_s: float, until: float, rng: random.Random) -> None:
    """Take spot servers back, as an operator's reclaimer would: delete one at random."""
    while time.monotonic() < until:
        time.sleep(every_s * rng.uniform(0.5, 1.5))
        try:
            active = [s for s in stack.servers(tags="sco") if s["status"] == "ACTIVE"]
            if active:
                victim = rng.choice(active)
                stack.conn.compute.delete(f"/servers/{victim['id']}", microversion="2.90")
                reclaimed[0] += 1
        except Exception as e:
            log(f"reclaim skipped: {type(e).__name__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=120.0, help="Seconds of chaos.")
    ap.add_argument("--kill-every", type=float, default=8.0)
    ap.add_argument(
        "--reclaim-every", type=float, default=6.0, help="A spot server is reclaimed this often."
    )
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--lease-ttl", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settle-s", type=float, default=20.0, help="Before the first kill.")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sco-chaos-") as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        result = run(root, args, rng)
    print(json.dumps(result, sort_keys=True))


def run(root: Path, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    pg = PostgresServer().start()
    url = pg.new_database()
    stack = NovaStack(
        root / "nova",
        int(os.environ.get("SCO_BENCH_OS_BASE_PORT", "19000")),
        {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"]},
        slots=4,
    )
    try:
        t0 = time.monotonic()
        stack.up()
        log(f"nova stack up in {time.monotonic() - t0:.0f} s; postgres at {url}")
        return measure(root, args, rng, stack, url)
    finally:
        stack.down()
        pg.stop()


def measure(
    root: Path, args: argparse.Namespace, rng: random.Random, stack: NovaStack, url: str
) -> dict[str, Any]:
    """The chaos on a running Nova stack and PostgreSQL database (the test suite's
    smoke run brings its own)."""
    replicas: Replicas | None = None
    watcher: Takeovers | None = None
    reclaimed[0] = 0
    try:
        region = root / "region.yaml"
        region.write_text(yaml.safe_dump(stack.region(guaranteed=False)))
        demand = root / "demand.yaml"
        demand.write_text(
            yaml.safe_dump(
                {
                    "partitions": [
                        {"name": f"p{i:02d}", "kind": "slurm", "target_units": 1, "max_units": 1}
                        for i in range(PARTITIONS)
                    ]
                }
            )
        )
        env = dict(os.environ, OS_CLIENT_CONFIG_FILE=str(stack.clouds_yaml))
        run_args = [
            "--cloud",
            "sco-test",
            "--region",
            str(region),
            "--demand",
            str(demand),
            "--state",
            url,
            "--interval",
            "2s",
            "--lease-ttl",
            f"{args.lease_ttl}s",
        ]
        replicas = Replicas(root, run_args, env)
        for _ in range(args.replicas):
            replicas.start()
        watcher = Takeovers(url)
        watcher.start()
        time.sleep(args.settle_s)  # leases spread, first servers booting
        kills = 0
        chaos_end = time.monotonic() + args.duration
        reclaimer = threading.Thread(
            target=reclaim, args=(stack, args.reclaim_every, chaos_end, rng), daemon=True
        )
        reclaimer.start()
        while time.monotonic() < chaos_end:
            victim = rng.choice(sorted(replicas.procs))
            held = watcher.held_by(victim)
            at = time.time()
            replicas.kill(victim)
            watcher.killed(victim, at, held)
            kills += 1
            log(f"killed {victim} holding {sorted(held)}; starting a new replica")
            replicas.start()
            time.sleep(args.kill_every * rng.uniform(0.5, 1.5))
        reclaimer.join()
        log(f"chaos over ({reclaimed[0]} servers reclaimed); settling")
        settle_end = time.monotonic() + 120
        while time.monotonic() < settle_end:
            servers = stack.servers(tags="sco")
            active = [s for s in servers if s["status"] == "ACTIVE"]
            if len(active) == PARTITIONS and len(servers) == PARTITIONS and not watcher.pending:
                break
            time.sleep(2)
        time.sleep(6)  # a last round records what the cloud shows
        replicas.stop_all()
        watcher.stop()
        servers = stack.servers(tags="sco")
        result: dict[str, Any] = {
            "kills": kills,
            "reclaims": reclaimed[0],
            "max_takeover_s": round(max(watcher.done), 2) if watcher.done else None,
            "median_takeover_s": round(statistics.median(watcher.done), 2)
            if watcher.done
            else None,
            "takeovers": len(watcher.done),
            "untaken": len(watcher.pending),
            "servers_at_end": len(servers),
            "partitions": PARTITIONS,
            "replicas": args.replicas,
            "lease_ttl_s": args.lease_ttl,
            "duration_s": args.duration,
        }
        result.update(audit(url, servers))
        return result
    finally:
        if replicas is not None:
            replicas.stop_all()
        if watcher is not None and watcher._thread.is_alive():
            watcher.stop()


if __name__ == "__main__":
    with stop_on_signals():
        main()
