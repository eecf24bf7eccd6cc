"""`sco replay` against a real Slurm cluster: the same workload window and capacity
trace through slurmctld/slurmd on sco's nodes (Nova test stack), time sped up K-fold.

A real second stands for K simulated ones. Both sides read the same inputs: the
workload's first `--hours` as SWF, limits rounded up to whole real minutes; a trace
folder, one series per hall of the stack, a 1 standing for the hall's spot slots.
The real side: `sco run`, jobs submitted at submit/K (`sbatch -N n --exclusive`),
each "working" run/K s, saving its work on SIGTERM (sco's requeue) and resuming;
a reclaimer plays the trace as the lab's region does: a drop is announced notice/K
before it (Placement's spot capacity lowered, the newest excess servers given
`sco:reclaim-at`), and at the drop the servers still over it are deleted.
The sim side: `replay(ReplaySpec(...), ["sco"])`, cycle, requeue lead, notice, idle
keep and cold start (measured: create to slurmd registered) × K.

One pool per job (`--one-pool`, the default; `--spread` runs without): on the real
side slurmctld gets sco's job_submit.lua for the partition's pools (the region
file's: one spot pool per hall, then one guaranteed pool per hall), with
JobSubmitPlugins=lua and the pools' features on the FUTURE placeholders, as `sco
slurm conf|job-submit` print them, and sco.yaml says `slurm.one_pool: true`; the
sim side runs `ReplaySpec(one_pool=True)`, whose cluster keeps each job of many
nodes in the first pool in the same order that holds it. On both sides a job wider
than the trace's widest spot pool (`widest_pool`, the replay's
`one_pool_max_nodes`) is left free to span pools.

Where each run of a job of many nodes ran, from what Slurm gave it: the job script
records its start time and SLURM_JOB_NODELIST, and each node's pool is its
`pool-...` feature as sinfo showed it (or its server's `sco:pool`).
`one_pool_share_real` is the share of those runs whose nodes were all in one pool;
`one_pool_share_when_room_real` the same over the runs that started when some pool
had as many idle nodes of the partition as the job asked for. Those idle nodes are
an approximation: sinfo's, read every poll (0.5 real s, K/2 simulated ones), as of
the last read that had ended before the job script started, plus the run's own
nodes (idle the moment slurmctld gave them; a read may already show them
allocated, or miss them if they registered since). A node another job took between
that read and the start counts as idle still, so "room" may be a little generous.
`wide_jobs_multi_pool_real` and `_sim`: of the jobs of many nodes that ran, the
share that spanned pools in some run, on each side.

Prints one JSON line: {"jobs", "completed_real", "completed_sim", "requeues_real",
"requeues_sim", "wait_p95_real_s", "wait_p95_sim_s", "one_pool_share_real",
"one_pool_share_when_room_real", ...} (seconds are simulated).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from sco.adapters.slurm.nodes import node_name, partition_feature, pool_feature
from sco.domain.lifecycle import Timeouts
from sco.lab.region import COLD_START_S
from sco.lab.traces import TraceSet, load_traces, repeated
from sco.lab.workload.replay import ReplaySpec, replay, widest_pool
from sco.lab.workload.swf import Workload, read_swf
from sco_harness import services
from sco_harness.nova_slurm import nova_and_slurm
from sco_harness.openstack_stack import ROOT, NovaStack
from sco_harness.services import stop_on_signals
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster

# Its parts are in bench/slurmreplaylib. Run as a script, this file's folder is first
# on the path; loaded by path (the tests' `bench` fixture), it is not there at all. It
# goes last, so that no program in bench/ hides a module of the same name.
sys.path.append(str(Path(__file__).resolve().parent))

from slurmreplaylib.nova import Placement, delete, notice, spot_servers
from slurmreplaylib.setup import (
    one_pool_slurm,
    write_config,
    write_trace,
    write_window,
)
from slurmreplaylib.slurmside import (
    known_jobs,
    log,
    one_pool_shares,
    pct,
    retry,
    runs_of,
    sbatch,
)

HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"], "hall-c": ["c1", "c2"]}
SLOTS = 4  # CUSTOM_SPOT_SLOT per compute
DATA = ROOT / "src" / "sco" / "data"
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"}
JOB = """#!/bin/bash
# $1: the job's work in ms, $2: the bench's key for it (its Slurm id may change: a
# slurmctld crash can lose a job and hand its id out again). A SIGTERM (sco's requeue)
# saves the work done; a rerun resumes.
D={dir}; id=$2; t0=$(date +%s%N); saved=0
[ -f $D/$id.work ] && saved=$(cat $D/$id.work)
echo $id >> $D/started
echo $id $(date +%s.%N) $SLURM_JOB_NODELIST >> $D/runs
save() {{
  echo $(( saved + ($(date +%s%N) - t0) / 1000000 )) > $D/$id.tmp
  mv $D/$id.tmp $D/$id.work; exit 143
}}
trap save TERM; left=$(( $1 - saved ))
if [ $left -gt 0 ]; then
  sleep $(( left / 1000 )).$(printf %03d $(( left % 1000 ))) & wait $! || save
fi
echo $id >> $D/done
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, default=DATA / "workloads" / "synthetic-2d.swf")
    ap.add_argument("--speedup", type=float, default=120.0, help="Simulated s per real s.")
    ap.add_argument("--hours", type=float, default=36.0, help="The workload's first hours.")
    ap.add_argument("--max-nodes", type=int, default=24, help="Most nodes (wider jobs left out).")
    ap.add_argument("--procs-per-node", type=int, default=None)
    ap.add_argument("--trace", type=Path, default=DATA / "traces" / "apache" / "v100-9zone")
    ap.add_argument("--notice-s", type=float, default=12.0, help="Real notice before a drop.")
    ap.add_argument("--requeue-lead-s", type=float, default=6.0, help="Real requeue lead.")
    ap.add_argument("--interval-s", type=float, default=2.0, help="sco's real cycle.")
    ap.add_argument("--cold-start-s", type=float, default=2.5, help="Real boot the pools say.")
    ap.add_argument("--limit-s", type=float, default=2400.0, help="Give up after this long.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-port", type=int, default=19400)
    ap.add_argument("--keep", type=Path, default=None, help="Run folder to keep (logs).")
    way = ap.add_mutually_exclusive_group()
    way.add_argument("--one-pool", dest="one_pool", action="store_true", default=True,
                     help="Slurm keeps each job of many nodes in one pool (sco's "
                     "job_submit.lua, slurm.one_pool), on both sides (the default).")  # fmt: skip
    way.add_argument("--spread", dest="one_pool", action="store_false",
                     help="Slurm places jobs over any pools, on both sides.")  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sco-bench-slurm-replay-") as tmp:
        print(json.dumps(run(args.keep or Path(tmp), args), sort_keys=True))


def run(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    prepare = partial(_prepare, k=args.speedup)
    with nova_and_slurm(folder, args.base_port, HALLS, SLOTS, prepare=prepare, log=log) as up:
        return measure(folder, *up, args)


def _prepare(cluster: SlurmCluster, k: float) -> None:
    _requeue_hold(cluster, k)
    cluster._addresses = _free_addresses(cluster)  # type: ignore[assignment]


def _free_addresses(cluster: SlurmCluster) -> Iterator[int]:
    """Node addresses (and netns numbers) of the cluster's /24 that no live node holds,
    lowest first: the harness counts them up from .10 and never reuses one, so a run
    that boots more than 245 nodes (a 36 h window at 120x boots ~300) stopped
    booting any (its boot thread died on `ip addr add ....256/24`)."""
    while True:
        held = {int(n.address.rsplit(".", 1)[1]) for n in cluster.nodes.values()}
        free = [
            k for k in range(10, 255)
            if k not in held and not Path(f"/var/run/netns/sco{cluster.id}n{k}").exists()
        ]  # fmt: skip
        if not free:
            raise RuntimeError(f"Slurm cluster {cluster.id}: no node address left")
        yield free[0]


def _requeue_hold(cluster: SlurmCluster, k: float) -> None:
    """Slurm holds a requeued job cred_expire s (at least 5): the lab's 120 sim s, or near."""
    hold = max(5, math.ceil(120.0 / k))  # the lab's REQUEUE_HOLD_S
    text = cluster.conf.read_text()
    line = next(x for x in text.splitlines() if x.startswith("AuthInfo="))
    cluster.conf.write_text(text.replace(line, f"{line},cred_expire={hold}"))
    cluster.restart_ctld()


def measure(
    folder: Path, stack: NovaStack, cluster: SlurmCluster, boot: SlurmBoot,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """Both sides on running services (a smoke run's own); `boot` makes the nodes."""
    k = float(args.speedup)
    folder.mkdir(parents=True, exist_ok=True)
    workload = read_swf(args.workload, args.max_nodes, args.hours / 24, args.procs_per_node)
    swf = write_window(folder / "window.swf", workload, k)
    workload = read_swf(swf, workload.max_nodes, None, workload.procs_per_node)
    slots = {h: len(hosts) * stack.slots for h, hosts in stack.halls.items()}
    trace_dir = write_trace(folder / "trace", args.trace, list(stack.halls), max(slots.values()))
    idle_keep = 300.0  # SlurmPartition.idle_keep_s, which the lab's partition keeps
    # Wider jobs span pools on both sides: the replay's own one_pool_max_nodes.
    widest = widest_pool(ReplaySpec(workload=swf, traces=trace_dir), load_traces(trace_dir))
    config = write_config(folder, stack, cluster, workload.max_nodes, args, idle_keep / k, widest)
    way = "one pool per job" if args.one_pool else "spread over pools"
    log(f"{len(workload.jobs)} jobs over {args.hours} h at {k:g}x, {way}; "
        f"trace {args.trace.name}")  # fmt: skip
    cmd = [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config)]
    with one_pool_slurm(cluster, config, args.one_pool) as bracketed:
        proc = services.spawn(cmd, log=folder / "sco-run.log", cwd=ROOT)
        try:
            real = _drive(folder, args, stack, cluster, boot, workload, trace_dir, slots, proc)
        finally:
            services.stop_group(proc, signal.SIGTERM, 60)
            Placement(stack).set({})
        real["jobs_bracketed"] = bracketed()
    cold_s = real.pop("cold_start_real_s")
    spec = ReplaySpec(
        workload=swf, traces=trace_dir, days=real.pop("span_sim_s") / 86400,
        notice_s=args.notice_s * k, procs_per_node=workload.procs_per_node,
        max_nodes=workload.max_nodes, cycle_s=args.interval_s * k, seed=args.seed,
        requeue_lead=args.requeue_lead_s * k,
        cold_start_s=cold_s * k if cold_s is not None else COLD_START_S,
        # The real controller's timeouts run in real seconds: k simulated ones each.
        # (At the default ones a 3 s boot under load, 1800 s at 600x, expired every
        # create in the simulation: completed_sim 1 of 7.)
        timeouts=Timeouts().scaled(k),
        one_pool=args.one_pool,
    )  # fmt: skip
    _, runs, _ = replay(spec, ["sco"])
    sim = runs[0].outcomes
    result = {
        "jobs": len(workload.jobs),
        "completed_real": real.pop("completed"), "completed_sim": sim["jobs_completed"],
        "requeues_real": real.pop("requeues"), "requeues_sim": sim["requeues"],
        "wait_p95_real_s": real.pop("wait_p95_s"), "wait_p95_sim_s": sim["wait_p95_s"],
        "wait_p50_real_s": real.pop("wait_p50_s"), "wait_p50_sim_s": sim["wait_p50_s"],
        "reclaims_sim": sim["reclaims"], "unfinished_sim": sim["jobs_unfinished"],
        "one_pool": args.one_pool, "wide_jobs_multi_pool_sim": sim["wide_jobs_multi_pool"],
        "future_nodes_per_pool": workload.max_nodes if args.one_pool else 0,
        "one_pool_max_nodes": widest if args.one_pool else None,
        "speedup": k, "hours": args.hours, "max_nodes": workload.max_nodes,
        "cycle_s": spec.cycle_s, "requeue_lead_s": spec.requeue_lead_s,
        "notice_s": spec.notice_s, "cold_start_s": round(spec.cold_start_s, 1),
        "idle_keep_s": idle_keep, "trace": str(args.trace),
        "cold_start_real_s": cold_s, **real,
    }  # fmt: skip
    a, b, r = result["wait_p95_real_s"], result["wait_p95_sim_s"], result
    result["agree"] = {
        "all_completed": r["completed_real"] == r["completed_sim"] == r["jobs"],
        "requeues_within_2": abs(r["requeues_real"] - r["requeues_sim"]) <= 2,
        "wait_p95_within_20pct": a is not None and b is not None and abs(a - b) <= 0.2 * b,
    }
    return result


def _events(traces: TraceSet, halls: list[str], notice_s: float) -> list[Any]:
    """(sim time, kind, hall, drop time), ordered as the lab's region: capacity (2), notice (3)."""
    out = []
    for hall, s in zip(halls, traces.series, strict=False):
        for t, _ in s.changes():
            out.append((t, 2, hall, t))
            if notice_s > 0 and t > traces.start_s:
                out.append((max(traces.start_s, t - notice_s), 3, hall, t))
    return sorted(out)


def _drive(
    folder: Path, args: argparse.Namespace, stack: NovaStack, cluster: SlurmCluster,
    boot: SlurmBoot, workload: Workload, trace_dir: Path, slots: dict[str, int],
    proc: subprocess.Popen[bytes],
) -> dict[str, Any]:  # fmt: skip
    """The real side: jobs submitted, the trace played, each job's waits added up."""
    k = float(args.speedup)
    (jobs_dir := folder / "jobs").mkdir(exist_ok=True)
    (script := jobs_dir / "job.sh").write_text(JOB.format(dir=jobs_dir))
    script.chmod(0o755)
    for name in ("done", "started"):
        (jobs_dir / name).touch()
    halls, traces = list(stack.halls), load_traces(trace_dir)
    start, size = traces.start_s, traces.region.pool_size
    traces, _ = repeated(traces, start + args.limit_s * k)
    series = dict(zip(halls, traces.series, strict=False))

    def capacity(hall: str, value: int) -> int:
        return min(slots[hall], value * size if series[hall].binary else value)

    events = _events(traces, halls, args.notice_s * k)
    now_cap = {h: capacity(h, series[h].value_at(start)) for h in halls}
    placement = Placement(stack).set(now_cap)
    announced: dict[str, list[tuple[float, int]]] = {h: [] for h in halls}
    deadlines: dict[str, float] = {}  # server id -> when it goes (wall clock)
    t0 = time.time()

    def wall(sim_t: float) -> float:
        return t0 + (sim_t - start) / k

    # Keyed by the job's index in the window; jid: its Slurm id now.
    submitted: dict[int, float] = {}  # key -> wall time submitted
    jid: dict[int, int] = {}  # key -> Slurm id
    wants: dict[int, int] = {}  # key -> nodes asked for
    mine = partition_feature(cluster.sco_partition)
    pool_of: dict[str, str] = {}  # node -> its pool feature
    idle_at: list[float] = []  # when sinfo's answer was in hand (wall)
    idle_seen: list[frozenset[str]] = []  # the partition's idle nodes it showed
    pending_since: dict[int, float] = {}  # key -> waiting since (wall)
    created: dict[str, float] = {}  # server id -> created (wall)
    registered: dict[str, float] = {}  # node -> first seen in sinfo (wall)
    waited: defaultdict[int, float] = defaultdict(float)  # key -> time pending (wall)
    stats, deleted, done = Counter[str](), set[str](), set[int]()
    nxt, last_poll, last_check, last_log = 0, t0, t0, t0

    def submit(key: int, again: Callable[[], None]) -> int:
        j = workload.jobs[key]
        cmd = [str(script), str(round(j.run_s / k * 1000)), str(key)]
        return retry(partial(sbatch, cluster, jobs_dir, j.nodes, round(j.limit_s / k / 60),
                              cmd), "sbatch", again)  # fmt: skip

    def revive() -> None:  # Slurm 22.05's backfill thread segfaults now and then
        code = cluster.ctld_exit()
        if code is None:
            return
        log(f"slurmctld exited {code}: started again")
        stats["slurmctld_restarts"] += 1
        cluster.start_ctld()
        # Jobs submitted since its last state save are gone, and their ids will be
        # handed out again: submitted anew (their wait goes on).
        known = retry(partial(known_jobs, cluster), "squeue")
        finished = {int(x) for x in (jobs_dir / "done").read_text().split()}
        for key in [x for x in submitted if jid[x] not in known and x not in finished]:
            log(f"job {workload.jobs[key].job_id} (Slurm {jid[key]}) lost: submitted again")
            stats["lost_by_slurmctld"] += 1
            jid[key] = submit(key, lambda: None)
            pending_since.setdefault(key, time.time())

    while time.time() - t0 < args.limit_s:
        now = time.time()
        while nxt < len(workload.jobs) and t0 + workload.jobs[nxt].submit_s / k <= now:
            at = time.time()
            jid[nxt] = submit(nxt, revive)
            submitted[nxt], pending_since[nxt], wants[nxt] = at, at, workload.jobs[nxt].nodes
            nxt += 1
        if proc.poll() is not None:
            raise RuntimeError(f"sco run exited {proc.returncode}")
        if boot._thread is not None and not boot._thread.is_alive():
            raise RuntimeError("the servers' boot into Slurm nodes stopped (see its traceback)")
        revive()
        while events and wall(events[0][0]) <= time.time():
            t, kind, hall, drop = events.pop(0)
            held = retry(partial(spot_servers, stack, hall, deleted), "servers")
            servers = sorted(held, key=lambda s: s["created"], reverse=True)  # newest first
            if kind == 3:  # a drop announced: capacity lowered now, the newest noticed
                future = capacity(hall, series[hall].value_at(drop))
                announced[hall].append((drop, future))
                staying = [s for s in servers if deadlines.get(s["id"], math.inf) > wall(drop)]
                fresh = [s for s in staying if s["id"] not in deadlines]
                for s in fresh[: max(0, len(staying) - future)]:
                    # One Nova refuses (a server still building) goes unnoticed.
                    stats[
                        "notices" if notice(stack, s["id"], wall(drop)) else "notices_refused"
                    ] += 1
                    deadlines[s["id"]] = wall(drop)
            else:  # the drop: what is over capacity goes, noticed first, then the newest
                now_cap[hall] = capacity(hall, series[hall].value_at(t))
                announced[hall] = [(a, v) for a, v in announced[hall] if a > t]
                over = sorted(servers, key=lambda s: s["id"] not in deadlines)  # stable
                for s in over[: max(0, len(servers) - now_cap[hall])]:
                    stats["reclaims_unnoticed"] += s["id"] not in deadlines
                    delete(stack, s["id"], deleted)
            placement.want[hall] = min([now_cap[hall]] + [v for _, v in announced[hall]])
            retry(partial(placement.apply, hall), "placement")
        for sid in [i for i, d in deadlines.items() if d <= time.time()]:
            del deadlines[sid]
            if sid not in deleted:
                delete(stack, sid, deleted)
        now = time.time()
        queue = cluster.squeue()
        done = {int(x) for x in (jobs_dir / "done").read_text().split()} & set(submitted)
        mid = (last_poll + now) / 2
        for key in submitted:
            waiting = queue.get(jid[key]) in WAITING
            if waiting and key not in pending_since:
                pending_since[key] = mid
            elif not waiting and key in pending_since and (jid[key] in queue or key in done):
                waited[key] += mid - pending_since.pop(key)
        last_poll = now
        states = cluster.node_states()
        read = time.time()
        registered.update({name: now for name in states if name not in registered})
        for name, (_, features) in states.items():
            words = features.split(",")
            pool = next((w for w in words if w.startswith("pool-")), None)
            if mine in words and pool is not None and not name.startswith(f"{mine}-"):
                pool_of[name] = pool
        idle = frozenset(n for n, (state, _) in states.items() if n in pool_of and state == "idle")
        if not idle_seen or idle != idle_seen[-1]:
            idle_at.append(read)
            idle_seen.append(idle)
        if now - last_check > 3:
            last_check = now
            for s in retry(partial(stack.servers, tags="sco"), "servers"):
                created.setdefault(s["id"], datetime.fromisoformat(s["created"]).timestamp())
                if pool := (s.get("metadata") or {}).get("sco:pool"):
                    pool_of.setdefault(node_name(s["id"]), pool_feature(pool))
            for h in halls:
                retry(partial(placement.apply, h), "placement")  # Nova may have reset it
            stats["released"] += cluster.release_launch_failed()
        if nxt == len(workload.jobs) and len(done) == len(submitted):
            break
        if now - last_log >= 30:
            last_log = now
            log(f"t={now - t0:.0f} s (sim {(now - t0) * k / 3600:.1f} h): {nxt} submitted, "
                f"{len(done)} done, {len(states)} nodes, {dict(stats)}")  # fmt: skip
        time.sleep(max(0.0, 0.5 - (time.time() - now)))
    end = time.time()
    if unfinished := [jid[x] for x in submitted if x not in done]:
        log(f"{len(unfinished)} jobs unfinished at the limit:\n{cluster.describe(unfinished)}")
    for key, since in pending_since.items():
        waited[key] += end - since
    starts = Counter(int(x) for x in (jobs_dir / "started").read_text().split())
    waits = sorted(waited[j] * k for j in submitted)
    colds = sorted(registered[node_name(i)] - c - 0.5 for i, c in created.items()
                   if node_name(i) in registered)  # created: whole s; to seen in sinfo  # fmt: skip
    runs = runs_of(cluster, jobs_dir / "runs", wants)
    return {
        **one_pool_shares(runs, wants, pool_of, idle_at, idle_seen),
        "completed": len(done), "requeues": sum(max(0, starts[j] - 1) for j in submitted),
        "wait_p95_s": pct(waits, 0.95), "wait_p50_s": pct(waits, 0.50),
        "cold_start_real_s": round(colds[len(colds) // 2], 2) if colds else None,
        "servers": len(created), "wall_s": round(end - t0, 1),
        "reclaims_real": stats["notices"] + stats["notices_refused"] + stats["reclaims_unnoticed"],
        "span_sim_s": max((end - t0) * k * 1.5, workload.span_s + 86400.0), **stats,
    }  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with stop_on_signals():
        main()
