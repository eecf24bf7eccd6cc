"""The swarm (issue 25): a short run of fixed seeds that must hold every invariant, a
seed that replays exactly, checks that can fail, and mutants that still apply.

The long form is `bench/swarm.py`; these seeds were picked to cover every kind of
partition and fault, both kinds of leases and a second installation.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sco.lab.swarm.batch import Trial, run_trials, shrink, trials
from sco.lab.swarm.checks import Ledger, Notice, check_history
from sco.lab.swarm.promises import INVARIANTS
from sco.lab.swarm.run import SeedResult
from sco.lab.swarm.spec import ALL_KINDS, world_of
from sco.lab.sweep import Workers

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (5, 8, 18, 29, 125, 454)


def test_the_fixed_seeds_cover_every_fault_and_world_and_hold_every_invariant() -> None:
    specs = [world_of(s) for s in SEEDS]
    kinds = {f.kind for s in specs for f in s.faults}
    assert kinds == set(ALL_KINDS), f"seeds miss {set(ALL_KINDS) - kinds}"
    assert {p.kind for s in specs for p in s.partitions} == {"slurm", "kubernetes", "static"}
    assert {s.leases for s in specs} == {"database", "kubernetes"}
    # A second installation shares a Slurm and a Kubernetes cluster with the first.
    shared = {s.partitions[0].kind for s in specs if s.second_installation}
    assert {"slurm", "kubernetes"} <= shared
    results = dict(run_trials([Trial(s) for s in SEEDS], Workers(2)))
    failed = {
        t.seed: [v.describe() for v in r.violations] for t, r in results.items() if r.violations
    }
    assert failed == {}, failed
    checked = {name for r in results.values() for name, n in r.checked.items() if n}
    assert checked == set(INVARIANTS), f"never checked: {set(INVARIANTS) - checked}"


def test_a_seed_replays_exactly() -> None:
    runs = [r for _, r in run_trials([Trial(10), Trial(10)], Workers(2))]
    assert _shape(runs[0]) == _shape(runs[1])


def _shape(r: SeedResult) -> tuple[object, ...]:
    return (r.cycles, r.checked, r.misses, [v.describe() for v in r.violations])


def test_a_seed_gives_the_same_checks_on_the_twins_and_on_sqlite() -> None:
    """The worlds run on the in-memory twins by default; `--state sqlite` runs them on
    the SQL path. Both are held to one conformance suite, so a seed must check the same
    things, miss the same things and cycle as often on either (leases in the database
    and in Kubernetes, and a second installation, among these seeds)."""
    seeds = (6, 15, 179)
    specs = [world_of(s) for s in seeds]
    assert {s.leases for s in specs} == {"database", "kubernetes"}

    def shapes(state: str) -> dict[int, object]:
        todo = [Trial(s, state=state) for s in seeds]
        return {t.seed: _shape(r) for t, r in run_trials(todo, Workers(2))}

    assert shapes("memory") == shapes("sqlite")


def test_a_world_without_faults_has_none() -> None:
    (trial,) = trials(1, 6, ())
    assert trial.spec().faults == ()
    assert "--faults " in trial.command()


def test_a_schedule_shrinks_to_the_faults_that_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrinking keeps a fault only while taking it away makes the failure go: here a
    failure that needs exactly one fault of the schedule (stood in for by a result)."""
    from sco.lab.swarm import batch

    trial = Trial(2)
    culprit = len(trial.spec().faults) // 2

    def fake(t: Trial) -> SeedResult:
        return _result(["floor_holds"] if culprit in (t.keep or ()) else [])

    monkeypatch.setattr(batch, "replay", fake)
    small, _ = shrink(trial, _result(["floor_holds"]))
    assert small.keep == (culprit,)
    assert f"--keep {culprit}" in small.command()


def _result(broken: list[str]) -> SeedResult:
    from sco.lab.swarm.checks import Violation

    return SeedResult(0, 0.0, 0, [Violation(n, 0.0, "x") for n in broken], {}, {}, 0, 0.0)


# ---------------------------------------------------------------- the checks can fail


def test_work_cut_by_a_reclaim_sco_had_time_for_is_a_violation() -> None:
    ledger = Ledger(0.0)
    ledger.noticed["s1"] = Notice("p1", 100.0, 400.0)
    ledger.cycles["p1"] = [(110.0, True, True), (350.0, True, True)]
    ledger.cut("p1", "s1", "job 7", 400.0, 60.0, since=0.0)
    assert [v.invariant for v in ledger.violations] == ["reclaim_reaches_scheduler"]


def test_work_cut_with_the_scheduler_away_is_a_miss_with_its_cause() -> None:
    ledger = Ledger(0.0)
    ledger.noticed["s1"] = Notice("p1", 100.0, 400.0)
    ledger.cycles["p1"] = [(110.0, True, False), (350.0, True, False)]
    ledger.cut("p1", "s1", "job 7", 400.0, 60.0, since=0.0)
    assert ledger.violations == []
    assert ledger.misses == {"the scheduler was away between the notice and its deadline": 1}


def test_a_ready_instance_whose_node_sco_drained_is_a_violation() -> None:
    from sco.domain.lifecycle import State
    from sco_harness.builders import instance, spot_pool

    ledger = Ledger(0.0)
    ready = instance(spot_pool(), State.READY)
    assert ready.server_id is not None
    ledger.records("p1", [ready], [ready.server_id], {ready.server_id}, 10.0)
    assert [v.invariant for v in ledger.violations] == ["out_not_counted"]


def test_an_edge_off_the_table_is_a_violation(tmp_path: Path) -> None:
    from sqlalchemy import insert

    from sco.adapters.sqlstate import schema as t
    from sco.adapters.sqlstate.engine import sqlite_url
    from sco.adapters.sqlstate.store import SqlFleetStore

    store = SqlFleetStore(sqlite_url(tmp_path / "s.db"))
    row = {"partition": "p", "pool": "r/h/f", "at": 1.0, "reason": "", "code": ""}
    with store.engine.begin() as conn:
        conn.execute(
            insert(t.instance_history).values(
                instance_id="i", from_state=None, to_state="requested", trigger=None, **row
            )
        )
        conn.execute(insert(t.instance_history).values(instance_id="i", from_state="requested",
                                                       to_state="ready", trigger="node_joined",
                                                       **row))  # fmt: skip
    ledger = Ledger(0.0)
    check_history(ledger, store, 2.0)
    store.close()
    assert [v.invariant for v in ledger.violations] == ["transitions_on_table"]


@pytest.mark.parametrize("patch", sorted((ROOT / "bench" / "mutants").glob("*.patch")))
def test_every_mutant_still_applies(patch: Path) -> None:
    """bench/swarm.py reverts each seam's fix from these patches: one that no longer
    applies would leave its defect untested."""
    done = subprocess.run(
        ["git", "apply", "--check", str(patch)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_command_lists_its_faults_and_refuses_unknown_ones() -> None:
    sco = str(ROOT / ".venv" / "bin" / "sco")
    listed = subprocess.run(
        [sco, "lab", "swarm", "--list-faults"], capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0
    assert set(listed.stdout.split()) == {str(k) for k in ALL_KINDS}
    bad = subprocess.run(
        [sco, "lab", "swarm", "--faults", "meteor"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "unknown meteor" in bad.stderr


def test_every_invariant_is_a_promise_the_documentation_makes() -> None:
    """Issue 40: each invariant names the words of the documentation that promise it,
    and `sco lab swarm --list-invariants` prints them; the words must stand there."""
    from sco.lab.swarm.promises import PROMISES

    assert len(PROMISES) >= 18
    assert len({p.name for p in PROMISES}) == len(PROMISES)
    for p in PROMISES:
        page = ROOT / p.doc
        assert page.is_file(), p
        assert " ".join(p.says.split()) in " ".join(page.read_text().split()), p
    listed = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "sco"), "lab", "swarm", "--list-invariants"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    names = [line for line in listed.stdout.splitlines() if not line.startswith(" ")]
    assert names == [p.name for p in PROMISES]
    assert f'{PROMISES[0].doc}: "{PROMISES[0].says}"' in listed.stdout


def test_a_kubernetes_partition_grows_with_its_pending_pods(tmp_path: Path) -> None:
    """The swarm's Kubernetes demand is sco's intake over the cluster: the workload
    grown past the partition's targets gets its nodes all the same (a demand read
    from the targets would leave its pods pending)."""
    from sco.lab.swarm.kube import SimKube
    from sco.lab.swarm.run import TICK_S, Swarm
    from sco.lab.swarm.spec import START_S

    spec = world_of(1).with_faults([])
    (plan,) = [p for p in spec.partitions if p.kind == "kubernetes"]
    swarm = Swarm(spec, tmp_path, "memory")
    try:
        twin = swarm.blue.twins[plan.name]
        assert isinstance(twin, SimKube)
        twin.workload = ((0.0, plan.max_units),)  # max_units nodes' worth of pods
        while swarm.clock.now() < START_S + 1800:
            swarm.step(swarm.clock.now() + TICK_S)
        pending = [n for n, p in twin.pods.items() if not p["spec"].get("nodeName")]
        assert pending == []
        servers = [v for v in swarm.region.all_servers() if v.partition == plan.name]
        assert len(servers) == plan.max_units
    finally:
        swarm.blue.close()
