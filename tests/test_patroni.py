"""Fleet state on a two-node Patroni cluster (etcd, synchronous replication): the
primary node is lost while the controller writes; no acknowledged transition is
lost and writes resume on the promoted replica."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sco_harness.failover import run_failover
from sco_harness.patroni import PatroniCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[PatroniCluster]:
    c = PatroniCluster().start()
    yield c
    c.stop()


def test_losing_the_primary_loses_no_acknowledged_transition(
    cluster: PatroniCluster, tmp_path: Path
) -> None:
    result = run_failover(cluster, tmp_path, after_s=8)
    assert result.acked > 0
    assert result.failed_cycles > 0, "the loss was felt"
    assert result.lost == 0, result
    assert result.write_outage_s <= 30, result
    assert result.cycles > result.failed_cycles
    print(result.as_dict())
