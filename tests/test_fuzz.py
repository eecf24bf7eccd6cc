"""A hundred fuzz cases of every input kind (bench/fuzz.py runs 50,000): every
case is accepted or refused with sco's own error, and a sample of the files goes
through the real `sco` command, which exits 0 or 2 with one line saying why."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from sco_harness.fuzz import draw_cases, run_commands, run_target
from sco_harness.fuzz.kinds import targets
from sco_harness.fuzz.values import _retyped

BENCH = Path(__file__).resolve().parents[1] / "bench" / "fuzz.py"


def _hooks() -> object:
    spec = importlib.util.spec_from_file_location("sco_bench_fuzz", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.app_hooks()


TARGETS = {t.kind: t for t in targets(_hooks())}  # type: ignore[arg-type]


def test_every_input_the_issue_names_is_fuzzed() -> None:
    assert set(TARGETS) == {
        "config", "region", "demand", "traces", "events", "nova_placement", "slurm_json",
        "kubernetes_objects", "distributor_api",
    }  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_no_crash_and_no_unclear_error(kind: str) -> None:
    tally = run_target(TARGETS[kind], 100, seed=5)
    assert tally.cases == 100
    assert tally.findings == [], [f.as_dict() for f in tally.findings[:3]]
    # The cases reach past the first check: some are accepted, some refused.
    assert tally.accepted > 0, tally.as_dict()


@pytest.mark.parametrize("kind", sorted(k for k, t in TARGETS.items() if t.command))
def test_the_sco_command_exits_0_or_2_saying_why(kind: str) -> None:
    target = TARGETS[kind]
    tally = run_commands(target, draw_cases(target, 4, seed=11), workers=2)
    assert tally.command_cases == 4
    assert tally.findings == [], [f.as_dict() for f in tally.findings[:3]]


def test_an_integer_past_a_float_is_retyped_as_an_infinity() -> None:
    # Found by the 50,000-case run: float(10**400) stopped it with an OverflowError.
    assert _retyped(10**400, 1) == math.inf
    assert _retyped(-(10**400), 1) == -math.inf
    assert _retyped(3, 1) == 3.0
