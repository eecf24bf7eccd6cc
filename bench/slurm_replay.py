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
import bisect
import contextlib
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
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml

from sco.adapters.openstack.resources import META_CLASS, META_RECLAIM_AT
from sco.adapters.slurm.nodes import node_name, partition_feature, pool_feature, slurm_conf_lines
from sco.assembly.settings import load
from sco.assembly.slurm import job_submit, region_pools
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

T = TypeVar("T")
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


def log(msg: str) -> None:
    print(f"[bench/slurm_replay] {msg}", file=sys.stderr, flush=True)


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
    swf = _write_window(folder / "window.swf", workload, k)
    workload = read_swf(swf, workload.max_nodes, None, workload.procs_per_node)
    slots = {h: len(hosts) * stack.slots for h, hosts in stack.halls.items()}
    trace_dir = _write_trace(folder / "trace", args.trace, list(stack.halls), max(slots.values()))
    idle_keep = 300.0  # SlurmPartition.idle_keep_s, which the lab's partition keeps
    # Wider jobs span pools on both sides: the replay's own one_pool_max_nodes.
    widest = widest_pool(ReplaySpec(workload=swf, traces=trace_dir), load_traces(trace_dir))
    config = _config(folder, stack, cluster, workload.max_nodes, args, idle_keep / k, widest)
    way = "one pool per job" if args.one_pool else "spread over pools"
    log(f"{len(workload.jobs)} jobs over {args.hours} h at {k:g}x, {way}; "
        f"trace {args.trace.name}")  # fmt: skip
    cmd = [sys.executable, "-m", "sco.apps.cli", "run", "--config", str(config)]
    with _one_pool_slurm(cluster, config, args.one_pool) as bracketed:
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


def _write_window(path: Path, workload: Workload, k: float) -> Path:
    """The window as SWF, each limit rounded up to whole real minutes (1 s spare)."""
    ppn = workload.procs_per_node
    lines = [f"; sco bench/slurm_replay window at {k:g}x", f"; MaxNodes: {workload.max_nodes}",
             f"; MaxProcs: {workload.max_nodes * ppn}"]  # fmt: skip
    for j in workload.jobs:
        minutes = math.ceil((j.limit_s / k + 1.0) / 60.0)
        limit, procs = minutes * 60.0 * k, j.nodes * ppn
        lines.append(f"{j.job_id} {j.submit_s:.10g} -1 {j.run_s:.10g} {procs} -1 -1 {procs} "
                     f"{limit:.10g} -1 1 1 1 1 1 1 -1 -1")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_trace(folder: Path, source: Path, halls: list[str], pool_size: int) -> Path:
    """The source's first series, one per hall (named after it), and a region file:
    a 1 of a 0/1 series is the hall's spot slots; a count is clamped to them."""
    traces = load_traces(source)
    if len(traces.series) < len(halls):
        raise SystemExit(f"--trace {source}: {len(traces.series)} series for {len(halls)} halls")
    folder.mkdir(parents=True, exist_ok=True)
    for hall, s in zip(halls, traces.series, strict=False):
        values = s.values if s.binary else tuple(min(v, pool_size) for v in s.values)
        rows = ["date,availability"] + [
            f"{datetime.fromtimestamp(t, UTC).strftime('%Y-%m-%d %H:%M:%S')},{v}"
            for t, v in zip(s.times, values, strict=True)
        ]
        (folder / f"{hall}.csv").write_text("\n".join(rows) + "\n")
    (folder / "region.yaml").write_text(yaml.safe_dump({
        "name": "lab", "flavor": "spot.small", "halls": len(halls), "pool_size": pool_size,
        "spot_price_per_h": 0.1, "guaranteed_price_per_h": 0.3}))  # fmt: skip
    return folder


def _config(
    folder: Path, stack: NovaStack, cluster: SlurmCluster, max_nodes: int,
    args: argparse.Namespace, idle_keep_s: float, widest: int,
) -> Path:  # fmt: skip
    k = float(args.speedup)
    one_pool = {"one_pool": True, "one_pool_max_nodes": widest} if args.one_pool else {}
    region, spec = folder / "region.yaml", stack.region()
    for pool in spec["pools"]:  # what the lab's pools say: their notice and cold start
        pool["notice_s"] = args.notice_s if pool["class"] == "spot" else 0.0
        pool["cold_start_s"] = args.cold_start_s
    region.write_text(yaml.safe_dump(spec))
    config = {
        "state": {"url": f"sqlite:///{folder / 'state.sqlite'}"},
        "provider": {"cloud": "sco-test", "region_file": str(region),
                     "clouds_file": str(stack.clouds_yaml)},
        "slurm": {"main": {"conf": str(cluster.conf), "cache_s": 0.5, "timeout_s": 5}},
        "partitions": [{
            "name": "hpc", "kind": "slurm", "demand": "slurm", "floor_units": 0,
            "max_units": max_nodes, "guaranteed_budget_units": max_nodes,
            "slurm": {"cluster": "main", "partitions": ["batch"], "cpus": cluster.cpus,
                      "memory_mb": cluster.memory_mb,
                      "requeue_lead_s": args.requeue_lead_s, "idle_keep_s": idle_keep_s,
                      **one_pool},
        }],
        "policy": {
            "interval_s": args.interval_s,
            "controller": {"list_grace_s": 20, "act": {"drain_s": 60.0 / k}},
            # the lab's defaults in simulated seconds, so in real ones here
            "exclusion": {"window_s": 600.0 / k, "base_cooldown_s": 600.0 / k,
                          "max_cooldown_s": 4 * 3600.0 / k, "quiet_reset_s": 3600.0 / k},
        },
        "http": {"run_port": 0},
        "log": {"level": "info"},
    }  # fmt: skip
    path = folder / "sco.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def _one_pool_slurm(cluster: SlurmCluster, config: Path, on: bool) -> Iterator[Callable[[], int]]:
    """With `on`: slurmctld as `sco slurm conf|job-submit` would have it for sco.yaml's
    partition: job_submit.lua beside slurm.conf, JobSubmitPlugins=lua and the region
    file's pool features on the FUTURE placeholders, slurmctld restarted; as it was
    on the way out (a test's cluster goes on). Yields how many jobs the script gave a
    bracket so far (its log lines)."""
    log_file = cluster.folder / "log" / "slurmctld.log"
    start = log_file.stat().st_size if log_file.exists() else 0

    def bracketed() -> int:
        if not log_file.exists():
            return 0
        with log_file.open("rb") as f:
            f.seek(start)
            return f.read().count(b"sco one-pool: uid")

    if not on:
        yield bracketed
        return
    settings = load(config)
    partition, pools = settings.partitions[0], region_pools(settings, [])
    lua = job_submit(settings, [partition.name])
    lines = partial(slurm_conf_lines, cluster.sco_partition, cluster.partitions, cluster.cpus,
                    cluster.memory_mb)  # fmt: skip
    old, new = lines(cluster.pools), lines(pools)
    before = cluster.conf.read_text()
    text = [new[old.index(x)] if x in old else x for x in before.splitlines()]
    if "JobSubmitPlugins=lua" not in text:
        text.insert(text.index(new[0]), "JobSubmitPlugins=lua")
    # Not (yet) what `sco slurm conf` prints: each pool's own FUTURE nodes, as many as
    # the partition's largest job. Slurm 22.05 counts a feature's nodes, live or
    # FUTURE, to tell whether a job could ever run: without them `sbatch -N n` is
    # refused ("Requested node configuration is not available") whenever n is at most
    # the partition's node count but more than any one pool's, and a job it took
    # waits as BadConstraints (which sco's intake does not count) until some pool
    # happens to hold n nodes.
    feature, n = partition_feature(cluster.sco_partition), partition.max_units
    at = text.index(new[2]) + 1  # after the guaranteed placeholder
    text[at:at] = [
        f"NodeName={feature}-p{k}-[1-{n}] State=FUTURE Feature=sco,{feature},{cls},"
        f"{pool_feature(p)} CPUs={cluster.cpus:g} RealMemory={cluster.memory_mb:g}"
        for k, (cls, p) in enumerate(pools)
    ]  # fmt: skip
    text = [
        f"MaxNodeCount={int(x.split('=')[1]) + n * len(pools)}" if x.startswith("MaxNodeCount=")
        else x for x in text
    ]  # fmt: skip
    script = cluster.conf.parent / "job_submit.lua"
    script.write_text(lua)
    cluster.conf.write_text("\n".join(text) + "\n")
    cluster.restart_ctld()
    try:
        yield bracketed
    finally:
        cluster.conf.write_text(before)
        script.unlink(missing_ok=True)
        cluster.restart_ctld()


class Placement:
    """Each hall's spot capacity, as `reserved` CUSTOM_SPOT_SLOT on its computes."""

    RC = "CUSTOM_SPOT_SLOT"

    def __init__(self, stack: NovaStack) -> None:
        self.stack, self.api = stack, stack.conn.placement
        self.want: dict[str, int] = {}  # hall -> spot capacity
        self.rps = {
            h: self._get(f"/resource_providers?name={h}")["resource_providers"][0]["uuid"]
            for hosts in stack.halls.values() for h in hosts
        }  # fmt: skip

    def _get(self, path: str) -> Any:
        r = self.api.get(path, microversion="1.39")
        if r.status_code != 200:
            raise RuntimeError(f"placement GET {path}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def apply(self, hall: str) -> None:
        """Spread the hall's capacity over its computes, those in use first."""
        hosts = self.stack.halls[hall]
        inv, used = {}, {}
        for h in hosts:
            inv[h] = self._get(f"/resource_providers/{self.rps[h]}/inventories/{self.RC}")
            used[h] = int(self._get(f"/resource_providers/{self.rps[h]}/usages")["usages"]
                          .get(self.RC, 0))  # fmt: skip
        left = self.want.get(hall, sum(i["total"] for i in inv.values()))
        cap = dict.fromkeys(hosts, 0)
        for h in sorted(hosts, key=lambda h: -used[h]):
            cap[h] = min(used[h], inv[h]["total"], left)
            left -= cap[h]
        for h in hosts:
            more = min(inv[h]["total"] - cap[h], left)
            cap[h], left = cap[h] + more, left - more
        for h in hosts:
            reserved = inv[h]["total"] - cap[h]
            if inv[h]["reserved"] != reserved:
                body = {**inv[h], "reserved": reserved}
                path = f"/resource_providers/{self.rps[h]}/inventories/{self.RC}"
                r = self.api.put(path, json=body, microversion="1.39")
                if r.status_code != 200:  # 409: Nova wrote it meanwhile: read it again
                    raise RuntimeError(f"placement: {h} reserved={reserved}: {r.status_code}")

    def set(self, want: dict[str, int]) -> Placement:
        self.want = dict(want)
        for hall in self.stack.halls:
            self.apply(hall)
        return self


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
        return _retry(partial(_sbatch, cluster, jobs_dir, j.nodes, round(j.limit_s / k / 60),
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
        known = _retry(partial(_known_jobs, cluster), "squeue")
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
            held = _retry(partial(_spot_servers, stack, hall, deleted), "servers")
            servers = sorted(held, key=lambda s: s["created"], reverse=True)  # newest first
            if kind == 3:  # a drop announced: capacity lowered now, the newest noticed
                future = capacity(hall, series[hall].value_at(drop))
                announced[hall].append((drop, future))
                staying = [s for s in servers if deadlines.get(s["id"], math.inf) > wall(drop)]
                fresh = [s for s in staying if s["id"] not in deadlines]
                for s in fresh[: max(0, len(staying) - future)]:
                    # One Nova refuses (a server still building) goes unnoticed.
                    stats[
                        "notices" if _notice(stack, s["id"], wall(drop)) else "notices_refused"
                    ] += 1
                    deadlines[s["id"]] = wall(drop)
            else:  # the drop: what is over capacity goes, noticed first, then the newest
                now_cap[hall] = capacity(hall, series[hall].value_at(t))
                announced[hall] = [(a, v) for a, v in announced[hall] if a > t]
                over = sorted(servers, key=lambda s: s["id"] not in deadlines)  # stable
                for s in over[: max(0, len(servers) - now_cap[hall])]:
                    stats["reclaims_unnoticed"] += s["id"] not in deadlines
                    _delete(stack, s["id"], deleted)
            placement.want[hall] = min([now_cap[hall]] + [v for _, v in announced[hall]])
            _retry(partial(placement.apply, hall), "placement")
        for sid in [i for i, d in deadlines.items() if d <= time.time()]:
            del deadlines[sid]
            if sid not in deleted:
                _delete(stack, sid, deleted)
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
            for s in _retry(partial(stack.servers, tags="sco"), "servers"):
                created.setdefault(s["id"], datetime.fromisoformat(s["created"]).timestamp())
                if pool := (s.get("metadata") or {}).get("sco:pool"):
                    pool_of.setdefault(node_name(s["id"]), pool_feature(pool))
            for h in halls:
                _retry(partial(placement.apply, h), "placement")  # Nova may have reset it
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
    runs = _runs(cluster, jobs_dir / "runs", wants)
    return {
        **_one_pool_shares(runs, wants, pool_of, idle_at, idle_seen),
        "completed": len(done), "requeues": sum(max(0, starts[j] - 1) for j in submitted),
        "wait_p95_s": _pct(waits, 0.95), "wait_p50_s": _pct(waits, 0.50),
        "cold_start_real_s": round(colds[len(colds) // 2], 2) if colds else None,
        "servers": len(created), "wall_s": round(end - t0, 1),
        "reclaims_real": stats["notices"] + stats["notices_refused"] + stats["reclaims_unnoticed"],
        "span_sim_s": max((end - t0) * k * 1.5, workload.span_s + 86400.0), **stats,
    }  # fmt: skip


def _known_jobs(cluster: SlurmCluster) -> set[int]:
    """The ids of every job slurmctld knows, finished ones too (kept MinJobAge)."""
    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], env=cluster.env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"squeue: {done.stderr.strip()}")
    return {int(x) for x in done.stdout.split() if x.isdigit()}


def _runs(cluster: SlurmCluster, path: Path, jobs: dict[int, int]) -> list[Any]:
    """(key, start (wall), nodes) of each run of the bench's jobs, as the job
    script recorded them (its start and SLURM_JOB_NODELIST, expanded by scontrol)."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    lists = {r[2] for r in rows if len(r) == 3}
    nodes = {x: _hostnames(cluster, x) for x in lists}
    return [(int(r[0]), float(r[1]), nodes[r[2]]) for r in rows
            if len(r) == 3 and int(r[0]) in jobs]  # fmt: skip


def _hostnames(cluster: SlurmCluster, listed: str) -> list[str]:
    done = subprocess.run(["scontrol", "show", "hostnames", listed], env=cluster.env,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    return done.stdout.split() if done.returncode == 0 else [listed]


def _one_pool_shares(
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


def _sbatch(cluster: SlurmCluster, jobs: Path, nodes: int, minutes: int, cmd: list[str]) -> int:
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


def _retry(fn: Callable[[], T], what: str, revive: Callable[[], None] = lambda: None) -> T:
    """`fn` again after a RuntimeError (a busy slurmctld, Nova or Placement)."""
    for _ in range(9):
        try:
            return fn()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"{what} (again in 1 s): {e}")
            revive()
            time.sleep(1.0)
    return fn()


def _spot_servers(stack: NovaStack, hall: str, deleted: set[str]) -> list[dict[str, Any]]:
    return [
        s for s in stack.servers(tags="sco")
        if s.get("OS-EXT-AZ:availability_zone") == hall and s["id"] not in deleted
        and (s.get("metadata") or {}).get(META_CLASS) == "spot" and s.get("status") != "ERROR"
    ]  # fmt: skip


def _notice(stack: NovaStack, sid: str, deadline: float) -> bool:
    r = stack.conn.compute.put(
        f"/servers/{sid}/metadata/{META_RECLAIM_AT}",
        json={"meta": {META_RECLAIM_AT: f"{deadline:.2f}"}}, microversion="2.90",
    )  # fmt: skip
    if r.status_code != 200:
        log(f"notice to {sid}: HTTP {r.status_code}")
    return r.status_code == 200


def _delete(stack: NovaStack, sid: str, deleted: set[str]) -> None:
    deleted.add(sid)
    r = stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
    if r.status_code not in (204, 404):
        log(f"reclaim of {sid}: HTTP {r.status_code}")


def _pct(ordered: list[float], q: float) -> float | None:
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1) if ordered else None


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with stop_on_signals():
        main()
