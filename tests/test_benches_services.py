"""The benches that start real services, at a smoke size on the services the test
session already runs (the shared Nova stack, PostgreSQL, a Kafka-protocol broker; Slurm's in
tests/test_slurm.py):
their own code runs to its JSON result, so none rots between measuring runs.

The chaos and control-plane benches at this size are also the Nova tier's tests of
replicas killed under reclaims (nothing duplicated, leaked or lost, every lease
taken over) and of the control plane as separate processes (a pool reclaimed at
once is excluded and refilled elsewhere, every committed event reaches the topic
and pool history, every process stops cleanly)."""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from sco.engine.cycle import PHASES
from sco_harness.kafka_broker import TansuBroker
from sco_harness.openstack_stack import NovaStack
from sco_harness.patroni import PatroniCluster
from sco_harness.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[1]
Bench = Callable[[str], ModuleType]  # the `bench` fixture: a program of bench/ as a module


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    b = TansuBroker(tmp_path_factory.mktemp("tansu")).start()
    yield b
    b.stop()


def test_chaos_bench(
    stack: NovaStack, postgres: PostgresServer, tmp_path: Path, bench: Bench
) -> None:
    stack.clear()
    chaos = bench("chaos")
    args = argparse.Namespace(
        duration=10.0, kill_every=5.0, reclaim_every=4.0, replicas=2, lease_ttl=6.0, settle_s=8.0
    )
    result = chaos.measure(tmp_path, args, random.Random(1), stack, postgres.new_database())
    assert result["kills"] >= 1
    assert result["duplicate_creates"] == 0, result
    assert result["leaked_servers"] == 0, result
    assert result["lost_transitions"] == 0, result
    assert result["untaken"] == 0, result


def test_controlplane_bench(
    stack: NovaStack, postgres: PostgresServer, broker: TansuBroker, tmp_path: Path, bench: Bench
) -> None:
    stack.clear()  # the chaos bench leaves its fleet behind
    controlplane = bench("controlplane")
    region = tmp_path / "region.yaml"
    region.write_text(yaml.safe_dump(stack.region()))
    result = controlplane.measure(
        tmp_path,
        stack,
        postgres.new_database(),
        broker,
        region,
        steady_s=2.0,
        partitions=4,
        min_candidates=1,  # two halls: one spot pool must stay placeable
    )
    for loss in ("duplicate_creates", "leaked_servers", "lost_transitions", "lost_events"):
        assert result[loss] == 0, result
    assert result["cycles"] > 0
    assert set(result["phase_p99_s"]) == set(PHASES), result  # where the cycles' time went
    assert result["events_in_history"] == result["events_committed"] > 0, result
    assert set(result["exit_codes"].values()) == {0}, result  # every process stopped cleanly


def test_soak_bench(stack: NovaStack, broker: TansuBroker, tmp_path: Path, bench: Bench) -> None:
    """Half a minute of the soak: a replica killed, a server reclaimed, the Patroni
    primary killed, one rolling stop; nothing duplicated, leaked or lost, and the
    replica stopped with SIGTERM exits 0."""
    stack.clear()
    soak = bench("soak")
    region = tmp_path / "region.yaml"
    region.write_text(yaml.safe_dump(stack.region()))
    args = argparse.Namespace(
        minutes=0.5, kill_every_s=10.0, reclaim_every_s=8.0, restart_after_s=2.0,
        failover_at_s=15.0, warmup_s=5.0, measure_s=5.0, rolling_stops=1,
    )  # fmt: skip
    cluster = PatroniCluster().start()
    try:
        result = soak.measure(tmp_path, stack, cluster, broker, region, args)
    finally:
        cluster.stop()
    for loss in ("duplicate_creates", "leaked_servers", "lost_transitions", "lost_events"):
        assert result[loss] == 0, result
    assert len(result["kills"]) >= 1, result
    assert [h["exit"] for h in result["handovers"]] == [0], result


def test_distributor_bench(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "distributor.py"), "--agents", "40",
         "--replicas", "2", "--changes", "10", "--wait", "5", "--ramp", "1"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["agents"] == 40
    assert line["errors"] == 0, line
