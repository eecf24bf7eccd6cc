"""The operator's Slurm commands from `sco.yaml`: the slurm.conf lines a partition's
dynamic nodes need (`sco slurm conf`), the job_submit.lua that keeps a job of many
nodes in one pool (`sco slurm job-submit`), the node-hours its jobs used by capacity
class (`sco slurm usage`), and the drainer a node's agent runs (`sco agent
--slurm-cluster`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sco.assembly.settings import PartitionSettings, Settings
from sco.assembly.state import open_fleet
from sco.assembly.wiring import StartError

if TYPE_CHECKING:  # an extra's adapter, imported when a command uses it
    from sco.adapters.slurm.drain import SlurmDrain


def slurm_partition(settings: Settings, partition: str) -> PartitionSettings:
    """The partition named `partition` with demand slurm (StartError naming those there
    are when there is none)."""
    found = [p for p in settings.partitions if p.name == partition and p.slurm is not None]
    if not found:
        slurm = [p.name for p in settings.partitions if p.slurm is not None]
        raise StartError(
            f"no partition {partition!r} with demand slurm (those: {', '.join(slurm) or 'none'})"
        )
    return found[0]


def region_pools(settings: Settings, flavors: list[str]) -> list[tuple[str, str]]:
    """(capacity class, pool id) of the region file's pools of `flavors` (all, if none);
    none without a region file."""
    if settings.provider.region_file is None:
        return []
    from sco.adapters.openstack.config import RegionFileError, load_region

    try:
        region = load_region(settings.provider.region_file)
    except RegionFileError as e:
        raise StartError(f"provider.region_file: {e}") from None
    return [
        (str(p.capacity_class), p.id)
        for p in region.domain_pools()
        if not flavors or p.flavor in flavors
    ]


def conf_lines(settings: Settings, partition: str) -> list[str]:
    """The slurm.conf lines PARTITION's dynamic nodes need (see `sco slurm conf`)."""
    from sco.adapters.slurm.nodes import slurm_conf_lines

    found = slurm_partition(settings, partition)
    s = found.slurm
    assert s is not None
    pools = region_pools(settings, list(found.flavors))
    gres = ",".join(f"{g}:{n}" for g, n in sorted(s.gres.items()))
    head = [
        f"# sco partition {partition}: dynamic nodes (Slurm >= 22.05), see README",
        "# Room for every node at once, with some to spare while nodes come and go.",
        f"MaxNodeCount={max(64, found.max_units * 2)}",
    ]
    if gres:
        head.append(f"GresTypes={','.join(sorted(s.gres))}")
    if pools:  # the pools' features are on the placeholders: a bracket of them is valid
        head += [
            "# Each job of many nodes in one pool: job_submit.lua next to slurm.conf, from "
            f"`sco slurm job-submit {partition}` (name every sco partition of the cluster).",
            "JobSubmitPlugins=lua",
        ]
    return head + slurm_conf_lines(
        partition, s.partitions, s.cpus, s.memory_mb, pools, gres, settings.installation
    )


def job_submit(
    settings: Settings, partitions: Sequence[str], default_partition: str | None = None
) -> str:
    """The job_submit.lua that keeps each job of many nodes of PARTITIONS' Slurm
    partitions in one of their pools (the region file's, in its order; see `sco slurm
    job-submit`). StartError without a region file, for a partition with no pool, for
    partitions on different Slurm clusters (one script serves one cluster), or for a
    default partition not theirs."""
    from sco.adapters.slurm.nodes import pool_feature
    from sco.adapters.slurm.onepool import job_submit_lua

    if settings.provider.region_file is None:
        raise StartError(
            "provider.region_file: not set; the pools a job is kept in are the region "
            "file's (sco slurm job-submit needs it)"
        )
    found = [slurm_partition(settings, p) for p in dict.fromkeys(partitions)]
    clusters = {f.slurm.cluster for f in found if f.slurm is not None}
    if len(clusters) > 1:
        raise StartError(
            f"partitions {', '.join(f.name for f in found)} are on Slurm clusters "
            f"{', '.join(sorted(clusters))}: one job_submit.lua serves one cluster"
        )
    pools: dict[str, list[str]] = {}
    widest: dict[str, int] = {}
    for f in found:
        assert f.slurm is not None
        features = [pool_feature(p) for _, p in region_pools(settings, list(f.flavors))]
        if not features:
            raise StartError(
                f"partition {f.name}: no pool of its flavors in provider.region_file "
                f"{settings.provider.region_file}"
            )
        for slurm_name in f.slurm.partitions:
            pools.setdefault(slurm_name, []).extend(features)
            most = f.slurm.one_pool_max_nodes
            if most is not None:
                widest[slurm_name] = min(widest.get(slurm_name, most), most)
    if default_partition is not None and default_partition not in pools:
        raise StartError(
            f"--default-partition {default_partition}: not a Slurm partition of "
            f"{', '.join(f.name for f in found)} (those: {', '.join(pools)})"
        )
    try:
        return job_submit_lua(pools, default_partition, widest)
    except ValueError as e:
        raise StartError(str(e)) from None


@dataclass(frozen=True, slots=True)
class NodeHours:
    """Node-hours and job runs by capacity class over a window."""

    node_hours: dict[str, float]
    runs: dict[str, int]
    doc: dict[str, object]  # the whole answer, for --json


def usage(settings: Settings, partition: str, since_s: float) -> NodeHours:
    """Node-hours PARTITION's jobs used by capacity class over the last `since_s`, from
    Slurm's accounting (sacct; needs slurmdbd) and fleet state's record of each server's
    class."""
    from sco.adapters.slurm.nodes import node_name
    from sco.adapters.slurm.tools import ClusterTools, SlurmBadOutput, SlurmError, SlurmTools
    from sco.adapters.slurm.usage import node_hours

    s = slurm_partition(settings, partition).slurm
    assert s is not None
    c = settings.slurm[s.cluster]
    tools = SlurmTools(ClusterTools(s.cluster, c.conf, c.bin_dir, max(c.timeout_s, 60.0)))
    until = time.time()
    start = until - since_s
    store = open_fleet(settings, run_migrations=False)
    try:
        classes = {node_name(sid): cls for sid, cls in store.server_classes(partition).items()}
    finally:
        store.close()
    try:
        runs = tools.allocations(s.partitions, start, until)
        found = node_hours(runs, classes, start, until, tools.hostnames)
    except (SlurmError, SlurmBadOutput) as e:
        raise StartError(
            f"slurm cluster {s.cluster}: {e} (node-hours need Slurm accounting: slurmdbd)"
        ) from None
    return NodeHours(dict(found.node_hours), dict(found.runs), found.as_dict())


def drainer(slurm_conf: Path | None, node: str, requeue_lead_s: float) -> SlurmDrain:
    """What a node's agent drains its own Slurm node with (`sco agent --slurm-node`):
    DRAIN, and on a reclaim the jobs that would not end by the deadline requeued
    `requeue_lead_s` before it."""
    from sco.adapters.slurm.drain import SlurmDrain
    from sco.adapters.slurm.tools import ClusterTools, SlurmTools

    tools = SlurmTools(ClusterTools("local", slurm_conf))
    return SlurmDrain(tools, node, requeue_lead_s, time.time, time.sleep)
