"""The Nova test stack and a real Slurm cluster whose dynamic nodes are sco's servers
there: what the Slurm benches run on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from sco_harness.openstack_stack import NovaStack
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster


@contextmanager
def nova_and_slurm(
    folder: Path,
    base_port: int,
    halls: dict[str, list[str]],
    slots: int,
    accounting: bool = False,
    prepare: Callable[[SlurmCluster], None] | None = None,
    log: Callable[[str], None] = print,
) -> Iterator[tuple[NovaStack, SlurmCluster, SlurmBoot]]:
    """Both up (`prepare` runs on the cluster before nodes boot), and down on the way
    out, whatever happened."""
    stack = NovaStack(folder / "nova", base_port, halls, slots)
    cluster = SlurmCluster(
        folder / "slurm", partitions=("batch",), sco_partition="hpc", accounting=accounting
    )
    started = time.monotonic()
    stack.up()
    try:
        cluster.start()
        try:
            if prepare is not None:
                prepare(cluster)
            boot = SlurmBoot(cluster, lambda: stack.servers(tags="sco")).start()
            log(f"Nova and Slurm up in {time.monotonic() - started:.0f} s")
            try:
                yield stack, cluster, boot
            finally:
                boot.stop()
        finally:
            cluster.stop()
    finally:
        stack.down()


def write_sco_config(
    folder: Path,
    stack: NovaStack,
    cluster: SlurmCluster,
    *,
    partition: Mapping[str, Any],
    slurm: Mapping[str, Any],
    policy: Mapping[str, Any],
    region: Mapping[str, Any] | None = None,
) -> Path:
    """sco.yaml (and region.yaml beside it) for one partition, "hpc", of the cluster's
    "batch" on the stack's pools, in SQLite in `folder`: `partition` (its units),
    `slurm` (its Slurm settings beyond the node shape) and `policy` say the rest;
    `region`: the region file's content (default: the stack's own)."""
    region_file = folder / "region.yaml"
    region_file.write_text(yaml.safe_dump(dict(region or stack.region())))
    config = {
        "state": {"url": f"sqlite:///{folder / 'state.sqlite'}"},
        "provider": {"cloud": "sco-test", "region_file": str(region_file),
                     "clouds_file": str(stack.clouds_yaml)},
        "slurm": {"main": {"conf": str(cluster.conf), "cache_s": 0.5, "timeout_s": 5}},
        "partitions": [{
            "name": "hpc", "kind": "slurm", "demand": "slurm", **partition,
            "slurm": {"cluster": "main", "partitions": ["batch"], "cpus": cluster.cpus,
                      "memory_mb": cluster.memory_mb, **slurm},
        }],
        "policy": dict(policy),
        "http": {"run_port": 0},
        "log": {"level": "info"},
    }  # fmt: skip
    path = folder / "sco.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
