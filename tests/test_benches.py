"""Every program in bench/ runs here at a smoke size, so that none rots between the
runs that measure (issue 25: bench/scorer.py crashed because no bench ran in CI).

Each prints one JSON line last; the test reads it and checks what the program says
it checks. The benches that start services of their own run in their tiers: see
`SERVICE_BENCHES` for where.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SMOKE: dict[str, list[str]] = {
    "cycle.py": ["--instances", "200", "--pools", "10", "--cycles", "3"],
    "exclusion.py": ["--events", "20000", "--batch", "2000"],
    "planner.py": ["--decisions", "10", "--sample", "2", "--instances", "1000", "--pools", "20"],
    "scorer.py": ["--smoke"],
    "simulate.py": ["--days", "0.25", "--check-days", "0.1"],
    "kube_intake.py": ["--pods", "200", "--nodes", "20"],
    "fuzz.py": ["--cases", "20", "--workers", "1", "--kinds", "config,events", "--commands", "2"],
    "swarm.py": ["--smoke", "--workers", "2"],
    "replay.py": ["--smoke"],
    "sweep.py": ["--smoke"],
}

# What a bench's line must say, beyond being one.
EXPECT: dict[str, dict[str, object]] = {
    "simulate.py": {"same_as_sql": True, "state": "memory"},
    "sweep.py": {"same_json": True, "same_json_on_cluster": True},
}

# Benches that start real services (the Nova stack, PostgreSQL, Patroni, Slurm, a
# broker) run at a smoke size in the tests of their tier instead.
SERVICE_BENCHES = {
    "chaos.py": "tests/test_benches_services.py",
    "controlplane.py": "tests/test_benches_services.py",
    "distributor.py": "tests/test_benches_services.py",
    "faults.py": "tests/test_faults.py",
    "failover.py": "tests/test_interrupt.py",  # run, then interrupted mid-way
    "openstack_tier.py": "tests/test_interrupt.py",  # run, then interrupted mid-way
    "slurm.py": "tests/test_slurm.py",
    "slurm_replay.py": "tests/test_slurm.py",
    "soak.py": "tests/test_benches_services.py",
    "tour.py": "tests/test_tour.py",  # the whole tour: it is the test
    "seed_platform.py": "tests/test_openstack_secrets.py",
}


def test_every_bench_has_a_smoke_run() -> None:
    benches = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert benches == set(SMOKE) | set(SERVICE_BENCHES), benches ^ (
        set(SMOKE) | set(SERVICE_BENCHES)
    )


@pytest.mark.parametrize("bench", sorted(SMOKE))
def test_bench_runs_at_smoke_size(bench: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / bench), *SMOKE[bench]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(line, dict)
    assert line, done.stdout
    for key, value in EXPECT.get(bench, {}).items():
        assert line[key] == value, line
