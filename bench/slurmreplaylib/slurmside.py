"""What bench/slurm_replay.py asks real Slurm: its jobs submitted, the ones it
knows, where each run ran (and whether in one pool), with retries while
slurmctld is busy or restarting."""

from __future__ import annotations

import bisect
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sco_harness.slurm_cluster import SlurmCluster

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[bench/slurm_replay] {msg}", file=sys.stderr, flush=True)


def known_jobs(cluster: SlurmCluster) -> set[int]:
    """The ids of every job slurmctld knows, finished ones too (kept MinJobAge)."""
    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], env=cluster.env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"squeue: {done.stderr.strip()}")
    return {int(x) for x in done.stdout.split() if x.isdigit()}


def runs_of(cluster: SlurmCluster, path: Path, jobs: dict[int, int]) -> list[Any]:
    """(key, start (wall), nodes) of each run of the bench's jobs, as the job
    script recorded them (its start and SLURM_JOB_NODELIST, expanded by scontrol)."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    lists = {r[2] for r in rows if len(r) == 3}
    nodes = {x: hostnames(cluster, x) for x in lists}
    return [(int(r[0]), float(r[1]), nodes[r[2]]) for r in rows
            if len(r) == 3 and int(r[0]) in jobs]  # fmt: skip


def hostnames(cluster: SlurmCluster, listed: str) -> list[str]:
    done = subprocess.run(["scontrol", "show", "hostnames", listed], env=cluster.env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    return done.stdout.split() if done.returncode == 0 else [listed]


def one_pool_shares(
    runs: list[Any], wants: dict[int, int], pool_of: dict[str, str],
    idle_at: list[float], idle_seen: list[frozenset[str]],
) -> dict[str, Any]:  # fmt: skip
    """Of the runs of jobs of many nodes: how many ran in one pool, over all and over
    those that started when some pool had as many idle nodes as the job asked for
    (idle: the last sinfo read before the start, and the run's own nodes)."""
    wide = [(jid, t, nodes) for jid, t, nodes in runs if wants[jid] > 1]
    one = room = one_room = unknown = 0
    spanned: dict[int, bool] = {}
    for jid, t, nodes in wide:
        unknown += any(n not in pool_of for n in nodes)
        pools = {pool_of.get(n, f"?{n}") for n in nodes}
        i = bisect.bisect_right(idle_at, t) - 1
        idle = (idle_seen[i] if i >= 0 else frozenset()) | set(nodes)
        had = Counter(pool_of[n] for n in idle if n in pool_of)
        fits = max(had.values(), default=0) >= wants[jid]
        one += len(pools) == 1
        room += fits
        one_room += fits and len(pools) == 1
        spanned[jid] = spanned.get(jid, False) or len(pools) > 1
    return {
        "multi_node_runs": len(wide), "multi_node_runs_one_pool": one,
        "one_pool_share_real": round(one / len(wide), 4) if wide else None,
        "multi_node_runs_when_room": room, "multi_node_runs_when_room_one_pool": one_room,
        "one_pool_share_when_room_real": round(one_room / room, 4) if room else None,
        "wide_jobs_multi_pool_real":
            round(sum(spanned.values()) / len(spanned), 4) if spanned else None,
        "multi_node_runs_pool_unknown": unknown,
    }  # fmt: skip


def sbatch(cluster: SlurmCluster, jobs: Path, nodes: int, minutes: int, cmd: list[str]) -> int:
    """Whole nodes, as the lab's jobs: one task of all the node's CPUs on each."""
    done = subprocess.run(
        ["sbatch", "--parsable", "-p", cluster.partitions[0], "-o", str(jobs / "%j.out"),
         "-N", str(nodes), "--ntasks-per-node=1", "-c", str(cluster.cpus), "--exclusive",
         "--requeue", "-t", str(minutes), *cmd],
        env=cluster.env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sbatch: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def retry(fn: Callable[[], T], what: str, revive: Callable[[], None] = lambda: None) -> T:
    """`fn` again after a RuntimeError (a busy slurmctld, Nova or Placement)."""
    for _ in range(9):
        try:
            return fn()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"{what} (again in 1 s): {e}")
            revive()
            time.sleep(1.0)
    return fn()


def pct(ordered: list[float], q: float) -> float | None:
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1) if ordered else None
