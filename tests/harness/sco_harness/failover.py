"""The controller writing to a Patroni cluster while its primary is lost.

A partition controller cycles on a simulated region whose capacity keeps
changing, so every cycle commits transitions; the store is wrapped to note
every transition whose commit returned (acknowledged). The primary node is
killed mid-run; the controller goes on trying each cycle. At the end every
acknowledged transition must be in the history of the new primary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.instances import Change, created
from sco.engine.clock import CountingIds, ManualClock
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import NewRequest
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.patroni import PatroniCluster
from sco_harness.runners import controller_of, ports_of


class AckedStore(SqlFleetStore):
    """Notes each transition whose commit returned to the caller."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.acked: list[tuple[str, str, float]] = []

    def record(
        self, changes: Sequence[Change], settle: Mapping[str, int] | None = None, fence: int = 0
    ) -> None:
        super().record(changes, settle, fence)
        self.acked.extend((c.after.id, c.after.state.value, c.at) for c in changes)

    def reserve(self, request: NewRequest, fence: int = 0) -> None:
        super().reserve(request, fence)
        self.acked.extend(
            (c.after.id, c.after.state.value, c.at)
            for c in (created(i, i.reason) for i in request.instances)
        )


@dataclass
class FailoverResult:
    acked: int = 0
    lost: int = 0
    write_outage_s: float = 0.0
    failover_s: float = 0.0
    cycles: int = 0
    failed_cycles: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rpo_transitions_lost": self.lost,
            "write_outage_s": round(self.write_outage_s, 2),
            "failover_s": round(self.failover_s, 2),
            "transitions_acked": self.acked,
            "cycles": self.cycles,
            "failed_cycles": self.failed_cycles,
        }


def run_failover(cluster: PatroniCluster, folder: Path, after_s: float = 15.0) -> FailoverResult:
    traces = folder / "traces"
    for zone in ("a", "b"):
        write_json_trace(traces, zone, [6, 2, 6, 3, 6, 1] * 40, gap_s=300)
    write_yaml(traces / "region.yaml", {"halls": 2, "guaranteed_quota_per_hall": 20})
    demand = write_yaml(
        folder / "demand.yaml",
        {"partitions": [{"name": "p1", "kind": "slurm", "target_units": 6, "max_units": 10}]},
    )
    region = SimRegion(load_traces(traces), SimConfig())
    clock = ManualClock(0.0)
    store = AckedStore(cluster.url())
    store.upsert_pools(region.pools())
    source = FileDemandSource.load(demand, "traces", 0.0)
    ports = ports_of(region, region, store, source, clock, ids=CountingIds())
    controller = controller_of(ports, lambda: ScoPolicy(HedgeConfig()))
    result = FailoverResult()
    stop = threading.Event()
    outage: list[float] = []  # first failure, first success after it

    def drive() -> None:
        while not stop.is_set():
            t = clock.now() + 60
            region.advance_to(t)
            clock.set(t)
            try:
                controller.cycle()
                result.cycles += 1
                if len(outage) == 1:
                    outage.append(time.monotonic())
            except Exception as e:  # the database is failing over
                result.failed_cycles += 1
                result.errors.append(type(e).__name__)
                if not outage:
                    outage.append(time.monotonic())
                controller.records.forget()  # reload once it is back
                time.sleep(0.2)
            time.sleep(0.05)

    writer = threading.Thread(target=drive, daemon=True)
    writer.start()
    try:
        time.sleep(5)  # writes flowing
        killed_at = time.monotonic()
        cluster.kill_primary()
        while cluster.roles() != {"primary", "down"}:
            time.sleep(0.2)
        result.failover_s = time.monotonic() - killed_at
        deadline = time.monotonic() + 60
        while len(outage) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(after_s - 5 if after_s > 5 else 0)  # writes go on after the failover
    finally:
        stop.set()
        writer.join(timeout=60)
    if len(outage) == 2:
        result.write_outage_s = outage[1] - outage[0]
    else:
        result.write_outage_s = float("inf")
    result.acked = len(store.acked)
    with store.engine.connect() as conn:
        rows = {
            (r.instance_id, r.to_state, round(r.at, 3))
            for r in conn.execute(text("SELECT instance_id, to_state, at FROM instance_history"))
        }
    result.lost = sum(1 for i, s, at in store.acked if (i, s, round(at, 3)) not in rows)
    store.close()
    return result
