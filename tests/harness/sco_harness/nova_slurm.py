"""The Nova test stack and a real Slurm cluster whose dynamic nodes are sco's servers
there: what the Slurm benches run on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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
