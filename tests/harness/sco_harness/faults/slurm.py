"""slurmctld restarted under `sco run`, with jobs running on sco's nodes.

`sco run` (a real process) on the Nova test stack leads two partitions: `hpc`,
whose demand is a real Slurm cluster's (slurmctld, munge, a slurmd per server in
a network namespace, booted as cloud-init would), running two jobs that each
fill a node; and `web`, a static partition of two servers that a churn thread
reclaims one at a time without notice, so `web` is creating while Slurm is away.

slurmctld is killed (SIGKILL: a crash, its state as last saved), stays down 30 s
(10 s in the short tier), and starts again on its saved state. Measured:
- hpc while Slurm is away: its cycles degraded (demand unknown), and none of its
  servers deleted: an unreadable scheduler must never read as no demand;
- stalled_partitions: `web` going more than 3 intervals without an undegraded
  cycle from the kill to the end of recovery (one partition's scheduler must not
  hold up another);
- jobs_lost: submitted jobs neither queued, running nor completed afterwards
  (slurmd keeps running jobs while slurmctld is away), and how soon after the
  restart both are seen running again;
- lost_transitions, duplicate_creates, leaked_servers: sco_harness.chaos.audit
  of fleet state against Nova; lost_events: committed events missing from the
  embedded event log;
- recovery_s: from slurmctld answering again to hpc's first undegraded cycle
  at target with every job running again. A SIGKILLed slurmctld forgets what
  happened since it last saved its state: dynamic nodes that registered (they
  are not asked to register again) and jobs that started, which it starts again
  on nodes it knows. The forgotten nodes' servers run a slurmd no controller
  knows; sco fails and replaces them once their scheduler has not listed them
  for `node_lost_after_s` (20 s here, 300 s by default).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from sco_harness.controlplane import ControlPlaneRun, wait_for
from sco_harness.faults import FaultResult
from sco_harness.faults.watch import (
    HALLS,
    SLOTS,
    CycleWatch,
    clear_servers,
    missing_events,
    ready_by_partition,
    settled_audit,
)
from sco_harness.openstack_stack import NovaStack, free_port
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster

BASE_PORT = 19780
INTERVAL_S = 2.0
CHURN_S = 8.0
JOBS = 2  # each fills a node (-c 2 on nodes of 2 CPUs)
WEB = 2
# A slurmctld killed loses the nodes that registered since it last saved its state
# (dynamic nodes are not asked to register again): sco replaces them after this long.
NODE_LOST_AFTER_S = 20.0


def log(msg: str) -> None:
    print(f"[faults/slurm] {msg}", file=sys.stderr, flush=True)


def run(folder: Path, *, short: bool = False, stack: NovaStack | None = None) -> list[FaultResult]:
    """`stack`: a Nova test stack already up (its servers are deleted at the end);
    None: one of its own on BASE_PORT."""
    folder.mkdir(parents=True, exist_ok=True)
    own = stack is None
    if stack is None:
        stack = NovaStack(folder / "nova", BASE_PORT, HALLS, SLOTS).up()
    cluster = SlurmCluster(folder / "slurm", partitions=("batch",), sco_partition="hpc").start()
    boot = SlurmBoot(cluster, lambda: stack.servers(tags="sco")).start()
    cp: ControlPlaneRun | None = None
    try:
        cp = ControlPlaneRun(folder / "cp", _config(folder, stack, cluster), dict(os.environ))
        port = free_port()
        cp.start("run", "run", "--metrics-port", str(port), port=port)
        result = _fault(cp, stack, cluster, hold_s=10.0 if short else 30.0)
        log(str(result.as_dict()))
        return [result]
    finally:
        if cp is not None:
            cp.stop_all()
        boot.stop()
        cluster.stop()
        try:
            clear_servers(stack)
        finally:
            if own:
                stack.down()


def _config(folder: Path, stack: NovaStack, cluster: SlurmCluster) -> dict[str, Any]:
    region_file = folder / "region.yaml"
    region_file.write_text(yaml.safe_dump(stack.region()))
    return {
        "state": {"url": f"sqlite:///{folder / 'state.sqlite'}"},
        "provider": {"cloud": "sco-test", "region_file": str(region_file),
                     "clouds_file": str(stack.clouds_yaml)},
        "slurm": {"main": {"conf": str(cluster.conf), "cache_s": 0.5, "timeout_s": 5}},
        "partitions": [
            {"name": "hpc", "kind": "slurm", "demand": "slurm", "floor_units": 1,
             "max_units": 4, "guaranteed_budget_units": 0,
             "slurm": {"cluster": "main", "partitions": ["batch"], "cpus": cluster.cpus,
                       "memory_mb": cluster.memory_mb, "idle_keep_s": 600}},
            {"name": "web", "kind": "kubernetes", "target_units": WEB, "floor_units": 1,
             "max_units": WEB},
        ],
        "policy": {"interval_s": INTERVAL_S,
                   "controller": {"list_grace_s": 20, "node_lost_after_s": NODE_LOST_AFTER_S}},
        "log": {"level": "info"},
    }  # fmt: skip


def _servers_of(stack: NovaStack, partition: str) -> set[str]:
    return {
        s["id"]
        for s in stack.servers(tags="sco")
        if (s.get("metadata") or {}).get("sco:partition") == partition
    }


def _churn(stack: NovaStack, stop: threading.Event, reclaims: list[float]) -> None:
    """One of `web`'s ACTIVE servers deleted every CHURN_S, as a reclaim without notice."""
    rng = random.Random(17)
    while not stop.wait(CHURN_S):
        try:
            victims = [
                s["id"]
                for s in stack.servers(tags="sco")
                if s["status"] == "ACTIVE" and s["metadata"].get("sco:partition") == "web"
            ]
            if victims:
                stack.conn.compute.delete(f"/servers/{rng.choice(victims)}", microversion="2.90")
                reclaims.append(time.time())
        except Exception as e:
            log(f"churn: {type(e).__name__}: {e}")


def _fault(
    cp: ControlPlaneRun, stack: NovaStack, cluster: SlurmCluster, hold_s: float
) -> FaultResult:
    url = cp.config["state"]["url"]
    proc = cp.procs["run"]
    watch = CycleWatch(lambda: cp.metrics("run")).start()
    stop = threading.Event()
    reclaims: list[float] = []
    try:

        def at_target() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"sco run exited:\n{cp.tail('run')}")
            ready = ready_by_partition(url)
            return ready.get("hpc", 0) >= JOBS and ready.get("web", 0) >= WEB

        jobs = [cluster.sbatch("-N1", "-c2", "-t", "30", seconds=1500) for _ in range(JOBS)]
        wait_for(at_target, 300, "hpc and web at target", every_s=1.0)
        wait_for(
            lambda: sum(1 for j in jobs if cluster.squeue().get(j) == "RUNNING") == JOBS,
            120,
            "the jobs running",
            every_s=1.0,
        )
        wait_for(lambda: watch.healthy_since(["hpc", "web"], time.time() - 5), 60, "cycles")
        threading.Thread(target=_churn, args=(stack, stop, reclaims), daemon=True).start()
        time.sleep(CHURN_S + 2 * INTERVAL_S)  # a reclaim under way in web
        hpc_before = _servers_of(stack, "hpc")
        log_mark = proc.log.stat().st_size
        down_at = time.time()
        cluster.stop_ctld(signal.SIGKILL)
        log(f"slurmctld killed; hpc holds {len(hpc_before)} servers")
        time.sleep(hold_s)
        hpc_during = _servers_of(stack, "hpc")
        restart_at = time.time()
        cluster.start_ctld()
        up_at = time.time()
        log(f"slurmctld answering again after {up_at - down_at:.0f} s")

        def recovered() -> float | None:
            healthy = watch.healthy_since(["hpc"], up_at)
            return healthy if healthy is not None and at_target() else None

        recovered_at = float(wait_for(recovered, 180, "hpc cycling undegraded at target"))

        def running_again() -> float | None:
            queue = cluster.squeue()
            return time.time() if all(queue.get(j) == "RUNNING" for j in jobs) else None

        try:
            jobs_again_at = wait_for(running_again, 120, "the jobs running again", every_s=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{cluster.describe(jobs)}") from None
        stop.set()
    finally:
        stop.set()
        watch.stop()
    queue = cluster.squeue()
    lost_jobs = [j for j in jobs if j not in queue and j not in cluster.completed()]
    # Cycles that ended while slurmctld was away (not the ones as it came back).
    degraded_during = [bad for _, bad in watch.cycles("hpc", down_at + 2 * INTERVAL_S, restart_at)]
    stalled = watch.stalled(["web"], down_at, recovered_at, 3 * INTERVAL_S, ok_only=True)
    missing = missing_events(url, 30)
    found = settled_audit(url, lambda: stack.servers(tags="sco"))
    fault_log = proc.log.read_bytes()[log_mark:].decode(errors="replace")
    return FaultResult(
        fault="slurmctld_restarted",
        recovery_s=max(0.0, max(recovered_at, float(jobs_again_at)) - up_at),
        recovered_when="slurmctld answered again, hpc completed an undegraded cycle at target "
        "and every job ran again",
        lost_transitions=found["lost_transitions"],
        lost_events=len(missing),
        duplicate_creates=found["duplicate_creates"],
        leaked_servers=found["leaked_servers"],
        stalled_partitions=len(stalled),
        details={
            "down_s": round(up_at - down_at, 1),
            "hpc_degraded_while_down": bool(degraded_during) and all(degraded_during),
            "hpc_cycles_while_down": len(degraded_during),
            "hpc_servers_lost_while_down": len(hpc_before - hpc_during),
            "jobs_lost": len(lost_jobs),
            "jobs_running_again_s": round(float(jobs_again_at) - up_at, 1),
            "web_reclaims": len(reclaims),
            "stalled": stalled,
            "tracebacks": fault_log.count("Traceback"),
            "run_exit": proc.popen.poll(),
            "transitions": found["history_rows"],
        },
    )
