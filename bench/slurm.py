"""Slurm jobs on sco's nodes while a reclaimer takes nodes with notice.

Starts the Nova test stack (three halls of two fake computes, four spot slots
each), a real Slurm cluster (slurmctld, munge, one slurmd per node in a network
namespace) and `sco run` from a sco.yaml whose partition takes its demand from
Slurm. Submits jobs of mixed sizes (one or two nodes, one or two CPUs each,
20-80 s, some asking for guaranteed capacity) in waves (a minute apart); meanwhile a reclaimer
gives a busy spot server a 40 s notice every so often, as a cloud operator's
tooling would. Ends when every job completed (or the time is up).

Prints one JSON line:
{"jobs_submitted", "jobs_completed", "jobs_lost", "requeued", "notices",
 "drained_before_deadline", "first_node_ready_s", "pending_to_start_p99_s",
 "node_hours", ...}
- requeued: job restarts Slurm counted (requeues before a reclaim's deadline);
- drained_before_deadline: noticed nodes seen in DRAIN before their deadline;
- first_node_ready_s: from the first submission to the first node registered;
- pending_to_start_p99_s: per job, from submission to first seen running;
- node_hours: by capacity class, as `sco slurm usage` reads them back from
  Slurm's accounting (slurmdbd).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sco.adapters.openstack.resources import META_RECLAIM_AT
from sco_harness import services
from sco_harness.nova_slurm import nova_and_slurm, write_sco_config
from sco_harness.openstack_stack import ROOT, NovaStack
from sco_harness.services import stop_on_signals
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}


def log(msg: str) -> None:
    print(f"[bench/slurm] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--notice-every", type=float, default=25.0, help="Seconds between notices.")
    ap.add_argument("--notice-s", type=float, default=40.0, help="Each notice's lead time.")
    ap.add_argument("--limit-s", type=float, default=900.0, help="Give up after this long.")
    ap.add_argument(
        "--job-s",
        type=float,
        nargs=2,
        default=(20.0, 80.0),
        metavar=("MIN", "MAX"),
        help="Each job runs this long, drawn uniformly.",
    )
    ap.add_argument("--wave-every", type=float, default=60.0, help="Seconds between waves.")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--base-port", type=int, default=19300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-bench-slurm-") as tmp:
        print(json.dumps(run(Path(tmp), args), sort_keys=True))


def run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    with nova_and_slurm(folder, args.base_port, HALLS, 4, accounting=True, log=log) as up:
        return measure(folder, *up, args)


def measure(
    folder: Path,
    stack: NovaStack,
    cluster: SlurmCluster,
    boot: SlurmBoot,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The measure on running services (the Slurm tier's smoke run brings its own)."""
    rng = random.Random(args.seed)
    config = _config(folder, stack, cluster)
    proc = services.spawn(
        [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config)],
        log=folder / "sco-run.log",
        cwd=ROOT,
    )
    try:
        result = _drive(args, rng, stack, cluster, boot, proc)
    finally:
        services.stop_group(proc, signal.SIGTERM, 60)
    result["node_hours"] = _usage(config)
    return result


def _config(folder: Path, stack: NovaStack, cluster: SlurmCluster) -> Path:
    return write_sco_config(
        folder, stack, cluster,
        partition={"floor_units": 1, "max_units": 16, "guaranteed_budget_units": 4},
        slurm={"requeue_lead_s": 15, "idle_keep_s": 60},
        policy={"interval_s": 2, "controller": {"list_grace_s": 20}},
    )  # fmt: skip


def _submit(cluster: SlurmCluster, rng: random.Random, job_s: tuple[float, float]) -> int:
    kind = rng.random()
    seconds = rng.uniform(*job_s)
    if kind < 0.1:
        return cluster.sbatch("-N1", "-c1", "-t", "3", "--constraint=guaranteed", seconds=seconds)
    if kind < 0.3:
        return cluster.sbatch("-N2", "-n4", "-t", "3", seconds=seconds)
    if kind < 0.6:
        return cluster.sbatch("-N1", "-c2", "-t", "3", seconds=seconds)
    return cluster.sbatch("-N1", "-c1", "-t", "3", seconds=seconds)


def _drive(
    args: argparse.Namespace,
    rng: random.Random,
    stack: NovaStack,
    cluster: SlurmCluster,
    boot: SlurmBoot,
    proc: subprocess.Popen[bytes],
) -> dict[str, Any]:
    t0 = time.monotonic()
    submitted: dict[int, float] = {}
    first_running: dict[int, float] = {}
    first_node: float | None = None
    notices: dict[str, float] = {}  # server id -> deadline (wall clock)
    drained: set[str] = set()
    last_notice = time.monotonic()
    waves = [args.jobs // 3, args.jobs // 3, args.jobs - 2 * (args.jobs // 3)]
    next_wave = 0.0
    while time.monotonic() - t0 < args.limit_s:
        now = time.monotonic() - t0
        if waves and now >= next_wave:
            for _ in range(waves.pop(0)):
                submitted[_submit(cluster, rng, tuple(args.job_s))] = time.monotonic()
            next_wave = now + args.wave_every
        if proc.poll() is not None:
            raise RuntimeError(f"sco run exited {proc.returncode}")
        if first_node is None and boot.booted:
            first_node = time.monotonic() - t0
        queue = cluster.squeue()
        for j, state in queue.items():
            if state == "RUNNING" and j not in first_running:
                first_running[j] = time.monotonic()
        states = cluster.node_states()
        for sid, deadline in notices.items():
            name = boot.booted.get(sid)
            if name and "drain" in states.get(name, ("", ""))[0] and time.time() < deadline:
                drained.add(sid)
        if time.monotonic() - last_notice >= args.notice_every:
            _notice(stack, boot, states, notices, args.notice_s, rng)
            last_notice = time.monotonic()
        if not waves and set(submitted) <= cluster.completed():
            break
        time.sleep(0.5)
    done = cluster.completed()
    waits = sorted(first_running[j] - submitted[j] for j in submitted if j in first_running)
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None
    return {
        "jobs_submitted": len(submitted),
        "jobs_completed": len(set(submitted) & done),
        "jobs_lost": len(set(submitted) - done),
        "requeued": _restarts(cluster, list(submitted)),
        "notices": len(notices),
        "drained_before_deadline": len(drained),
        "first_node_ready_s": round(first_node, 1) if first_node is not None else None,
        "pending_to_start_p99_s": round(p99, 1) if p99 is not None else None,
        "pending_to_start_p50_s": round(waits[len(waits) // 2], 1) if waits else None,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _notice(
    stack: NovaStack,
    boot: SlurmBoot,
    states: dict[str, tuple[str, str]],
    notices: dict[str, float],
    notice_s: float,
    rng: random.Random,
) -> None:
    """A busy spot server, not noticed yet, is told it goes in `notice_s`."""
    busy = [
        sid
        for sid, name in boot.booted.items()
        if sid not in notices
        and states.get(name, ("", ""))[0] in ("allocated", "mixed")
        and "spot" in states.get(name, ("", ""))[1]
    ]
    if not busy:
        return
    sid = rng.choice(sorted(busy))
    deadline = time.time() + notice_s
    r = stack.conn.compute.put(
        f"/servers/{sid}/metadata/{META_RECLAIM_AT}",
        json={"meta": {META_RECLAIM_AT: f"{deadline:.0f}"}},
        microversion="2.90",
    )
    if r.status_code == 200:
        notices[sid] = deadline
        log(f"notice: {boot.booted[sid]} goes in {notice_s:.0f} s")


def _usage(config: Path) -> dict[str, float]:
    """Node-hours by class as `sco slurm usage` reads them back from Slurm."""
    out = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "slurm", "usage", "hpc", "--since", "1h",
         "--json", "--config", str(config)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    hours: dict[str, float] = json.loads(out)["node_hours"]
    return hours


def _restarts(cluster: SlurmCluster, jobs: list[int]) -> int:
    total = 0
    for j in jobs:
        text = subprocess.run(
            ["scontrol", "show", "job", str(j)], env=cluster.env, capture_output=True,
            text=True, check=False,
        ).stdout  # fmt: skip
        for field in text.split():
            if field.startswith("Restarts="):
                total += int(field.split("=")[1])
    return total


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with stop_on_signals():
        main()
