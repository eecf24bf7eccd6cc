"""How bench/slurm_replay.py sets a run up: the workload's window and the trace as
files, sco.yaml for the Nova stack and the Slurm cluster, and slurmctld with sco's
job_submit.lua and pool features."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import yaml

from sco.adapters.slurm.nodes import partition_feature, pool_feature, slurm_conf_lines
from sco.assembly.settings import load
from sco.assembly.slurm import job_submit, region_pools
from sco.lab.traces import load_traces
from sco.lab.workload.swf import Workload
from sco_harness.nova_slurm import write_sco_config
from sco_harness.openstack_stack import NovaStack
from sco_harness.slurm_cluster import SlurmCluster


def write_window(path: Path, workload: Workload, k: float) -> Path:
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


def write_trace(folder: Path, source: Path, halls: list[str], pool_size: int) -> Path:
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


def write_config(
    folder: Path, stack: NovaStack, cluster: SlurmCluster, max_nodes: int,
    args: argparse.Namespace, idle_keep_s: float, widest: int,
) -> Path:  # fmt: skip
    k = float(args.speedup)
    one_pool = {"one_pool": True, "one_pool_max_nodes": widest} if args.one_pool else {}
    spec = stack.region()
    for pool in spec["pools"]:  # what the lab's pools say: their notice and cold start
        pool["notice_s"] = args.notice_s if pool["class"] == "spot" else 0.0
        pool["cold_start_s"] = args.cold_start_s
    return write_sco_config(
        folder, stack, cluster, region=spec,
        partition={"floor_units": 0, "max_units": max_nodes,
                   "guaranteed_budget_units": max_nodes},
        slurm={"requeue_lead_s": args.requeue_lead_s, "idle_keep_s": idle_keep_s, **one_pool},
        policy={
            "interval_s": args.interval_s,
            "controller": {"list_grace_s": 20, "act": {"drain_s": 60.0 / k}},
            # the lab's defaults in simulated seconds, so in real ones here
            "exclusion": {"window_s": 600.0 / k, "base_cooldown_s": 600.0 / k,
                          "max_cooldown_s": 4 * 3600.0 / k, "quiet_reset_s": 3600.0 / k},
        },
    )  # fmt: skip


@contextlib.contextmanager
def one_pool_slurm(cluster: SlurmCluster, config: Path, on: bool) -> Iterator[Callable[[], int]]:
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
