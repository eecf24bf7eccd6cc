"""Where a cycle's time goes (issue 26): every cycle reports its wall time by phase,
the metrics carry it as `sco_cycle_phase_seconds`, and the control-plane bench reads
a p99 per phase from several processes' metrics."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.engine.clock import CountingIds, ManualClock
from sco.engine.cycle import PHASES, CycleReport
from sco.engine.metrics import PlacementMetrics
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.controlplane import histogram_quantile
from sco_harness.runners import controller_of, ports_of


def _reports(tmp: Path) -> list[CycleReport]:
    traces = tmp / "traces"
    write_json_trace(traces, "a", [4] * 50, gap_s=600)
    write_yaml(traces / "region.yaml", {"halls": 1, "guaranteed_quota_per_hall": 2})
    demand = write_yaml(tmp / "demand.yaml", {"partitions": [
        {"name": "p1", "kind": "slurm", "target_units": 2, "max_units": 4}]})  # fmt: skip
    region = SimRegion(load_traces(traces), SimConfig())
    store = SqlFleetStore(sqlite_url(tmp / "state.db"))
    store.upsert_pools(region.pools())
    source = FileDemandSource.load(demand, "traces", 0.0)
    clock = ManualClock(0.0)
    ports = ports_of(region, region, store, source, clock, ids=CountingIds())
    controller = controller_of(ports, lambda: ScoPolicy(HedgeConfig()))
    out = []
    for t in range(0, 300, 30):
        region.advance_to(float(t))
        clock.set(float(t))
        out.append(controller.cycle())
    store.close()
    return out


def test_every_cycle_accounts_for_its_time_by_phase(tmp_path: Path) -> None:
    reports = _reports(tmp_path)
    assert any(r.created for r in reports), "the cycles acted"
    for r in reports:
        assert set(r.phases_s) == set(PHASES), r.phases_s
        assert all(v >= 0 for v in r.phases_s.values())
        # The phases are laps of one stopwatch inside the cycle's own: never more.
        assert sum(r.phases_s.values()) <= r.took_s


def test_the_phases_reach_the_metrics_and_a_p99_per_phase(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = PlacementMetrics(registry)
    reports = _reports(tmp_path)
    for r in reports:
        metrics.observe(r)
    text = generate_latest(registry).decode()
    for phase in PHASES:
        count = f'sco_cycle_phase_seconds_count{{partition="p1",phase="{phase}"}} '
        assert f"{count}{float(len(reports))}" in text, phase
        assert histogram_quantile([text, text], "sco_cycle_phase_seconds", 0.99, phase=phase)
    assert histogram_quantile([text], "sco_cycle_phase_seconds", 0.99, phase="none") is None


def test_a_quantile_by_label_takes_only_that_series() -> None:
    text = "\n".join(
        f'h_bucket{{phase="{p}",le="{le}"}} {n}'
        for p, counts in {"fast": (10, 10, 10), "slow": (0, 0, 10)}.items()
        for le, n in zip(("1.0", "10.0", "+Inf"), counts, strict=True)
    )
    assert histogram_quantile([text], "h", 0.5, phase="fast") == 0.5
    assert histogram_quantile([text], "h", 0.5, phase="slow") == 10.0
    assert histogram_quantile([text], "h", 0.5) == 1.0  # both: 20 samples, rank 10 in le=1
