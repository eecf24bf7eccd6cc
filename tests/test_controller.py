"""One partition's controller against the simulated region and a real SQLite store."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path

import pytest

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.instances import Instance
from sco.domain.lifecycle import State
from sco.engine.clock import CountingIds, ManualClock
from sco.engine.controller import PartitionController
from sco.engine.cycle import ControllerConfig
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import (
    HistoryRow,
    NewRequest,
    NodeView,
    Provider,
    Reservation,
    SchedulerCluster,
    ServerView,
)
from sco_harness.builders import instance, write_json_trace, write_yaml
from sco_harness.runners import controller_of, ports_of


class World:
    """A region with two spot pools, a store, a demand file, and a clock."""

    def __init__(
        self,
        tmp: Path,
        target: int = 3,
        sim: SimConfig | None = None,
        a_trace: list[int] | None = None,
    ) -> None:
        traces = tmp / "traces"
        write_json_trace(traces, "a", a_trace or [4] * 50, gap_s=600)
        write_json_trace(traces, "b", [4] * 50, gap_s=600)
        write_yaml(traces / "region.yaml", {"halls": 2, "guaranteed_quota_per_hall": 2})
        demand = write_yaml(
            tmp / "demand.yaml",
            {
                "partitions": [
                    {"name": "p1", "kind": "slurm", "target_units": target, "max_units": 10},
                ]
            },
        )
        self.region = SimRegion(load_traces(traces), sim or SimConfig())
        self.clock = ManualClock(0.0)
        self.store = SqlFleetStore(sqlite_url(tmp / "state.db"))
        self.store.upsert_pools(self.region.pools())
        self.demand = FileDemandSource.load(demand, "traces", 0.0)
        self.ids = CountingIds()

    def controller(
        self,
        provider: Provider | None = None,
        calls: int | Executor = 0,
        nodes: SchedulerCluster | None = None,
        config: ControllerConfig | None = None,
    ) -> PartitionController:
        """A fresh controller process: nothing in memory, everything from the store;
        the region is its provider and node plane unless others are given."""
        ports = ports_of(
            provider or self.region,
            nodes or self.region,
            self.store,
            self.demand,
            self.clock,
            ids=self.ids,
            calls=calls,
        )
        # No hedge: exact counts.
        return controller_of(
            ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)), config or ControllerConfig()
        )

    def at(self, t: float) -> None:
        self.region.advance_to(t)
        self.clock.set(t)

    def records(self) -> list[Instance]:
        return self.store.instances("p1")


def test_fills_the_target_and_reaches_ready(tmp_path: Path) -> None:
    w = World(tmp_path)
    c = w.controller()
    report = c.cycle()
    assert report.created == 3
    assert report.plan_generation == 1
    assert {i.state for i in w.records()} == {State.CREATING}
    w.at(150.0)
    c.cycle()
    assert [i.state for i in w.records()] == [State.READY] * 3
    assert w.store.reservations() == []  # dropped once the servers were observed
    assert c.cycle().plan_generation == 1  # nothing changed: no new generation


def test_adopts_tagged_servers_it_has_no_record_of(tmp_path: Path) -> None:
    w = World(tmp_path)
    pool = next(p for p in w.region.pools() if p.is_spot)
    w.region.create(pool.id, 2, "req-lost", "p1", 7)
    w.at(5.0)
    report = w.controller().cycle()
    adopted = [i for i in w.records() if i.reason == "adopted"]
    assert len(adopted) == 2
    assert {i.request_id for i in adopted} == {"req-lost"}
    assert report.created == 1  # 2 adopted + 1 new = target 3
    assert w.region.server_count() == 3


def test_restart_after_create_before_recording_does_not_create_twice(tmp_path: Path) -> None:
    # The crashed process had reserved, written REQUESTED records and sent the create,
    # then died before recording the answer.
    w = World(tmp_path)
    pool = next(p for p in w.region.pools() if p.is_spot)
    versions = w.store.pool_records()
    records = tuple(
        Instance(
            id=f"inst-{n}",
            partition="p1",
            pool=pool.id,
            capacity_class=pool.capacity_class,
            units=1,
            state=State.REQUESTED,
            version=0,
            request_id="req-1",
            plan_generation=1,
            created_at=0.0,
            state_since=0.0,
        )
        for n in range(2)
    )
    w.store.reserve(
        NewRequest(
            Reservation("req-1", pool.id, "p1", 2, 0.0, 600.0), records, versions[pool.id].version
        )
    )
    w.region.create(pool.id, 2, "req-1", "p1", 1)
    w.at(30.0)
    report = w.controller().cycle()
    assert report.created == 1  # the third, in the other pool; none again for req-1
    assert w.region.server_count() == 3
    got = [i for i in w.records() if i.request_id == "req-1"]
    assert {i.id for i in got} == {r.id for r in records}
    assert {i.state for i in got} == {State.CREATING}
    assert not [i for i in w.records() if i.reason == "adopted"]
    assert all(i.server_id for i in got)
    assert "req-1" not in {r.request_id for r in w.store.reservations()}


def test_vanished_server_is_closed_and_replaced(tmp_path: Path) -> None:
    w = World(tmp_path, target=2)
    c = w.controller()
    c.cycle()
    w.at(200.0)
    c.cycle()
    victim = w.records()[0]
    assert victim.server_id is not None
    w.region.delete([victim.server_id])  # someone else deleted it: looks like a reclaim
    w.at(300.0)
    report = c.cycle()
    assert report.created == 1
    rows = w.store.history(victim.id)
    assert (rows[-1].to_state, rows[-1].trigger) == ("gone", "server_vanished")


def test_stale_reservations_are_swept(tmp_path: Path) -> None:
    w = World(tmp_path, target=0)
    pool = next(p for p in w.region.pools() if p.is_spot)
    w.store.reserve(
        NewRequest(
            Reservation("req-dead", pool.id, "other", 2, 0.0, 600.0),
            (),
            w.store.pool_records()[pool.id].version,
        )
    )
    c = w.controller()
    c.cycle()
    assert len(w.store.reservations()) == 1
    w.at(601.0)
    c.cycle()
    assert w.store.reservations() == []


def test_provider_errors_degrade_without_acting(tmp_path: Path) -> None:
    w = World(tmp_path, sim=SimConfig(error_rate=1.0))
    report = w.controller().cycle()
    assert report.degraded.startswith("observe failed")
    assert report.created == 0
    assert w.records() == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_flaky_provider_never_leaks_or_duplicates(tmp_path: Path, seed: int) -> None:
    w = World(tmp_path, sim=SimConfig(error_rate=0.3, timeout_rate=0.3, seed=seed))
    c = w.controller()
    for k in range(1, 120):
        c.cycle()
        w.at(k * 30.0)
    w.region.config = SimConfig()  # the weather clears
    for k in range(120, 200):
        c.cycle()
        w.at(k * 30.0)
    live = [i for i in w.records() if i.state in (State.READY,)]
    assert len(live) == 3
    assert w.region.server_count() == 3, "no server leaked, none created twice"
    tracked = {i.server_id for i in w.records()}
    assert {s.server_id for s in w.region.list("p1")} <= tracked


def test_requests_of_a_dead_sender_are_closed_after_the_listing_grace(tmp_path: Path) -> None:
    """A process reserved and wrote REQUESTED records, then died before sending the
    create. Its successor closes them once listings had time to show any server,
    instead of staying short until they time out, and creates anew."""
    w = World(tmp_path)
    pool = next(p for p in w.region.pools() if p.is_spot)
    version = w.store.pool_records()[pool.id].version
    res = Reservation("req-dead", pool.id, "p1", 3, 0.0, 600.0)
    lost = [
        dataclasses.replace(
            instance(pool, State.REQUESTED, partition_name="p1", created_at=0.0),
            request_id="req-dead",
        )
        for _ in range(3)
    ]
    w.store.reserve(NewRequest(res, tuple(lost), version))
    successor = w.controller()
    w.at(10.0)
    assert successor.cycle().created == 0  # within the grace: a server may yet show up
    w.at(61.0)
    report = successor.cycle()
    assert report.created == 3
    states = {i.id: i.state for i in w.store.instances("p1")}
    assert all(i.id not in states for i in lost), "closed as failed"
    assert w.store.reservations()[0].request_id != "req-dead"
    assert w.region.server_count() == 3


def test_servers_that_come_and_go_before_a_listing_do_not_hold_the_partition_short(
    tmp_path: Path,
) -> None:
    """Regression: creates return before the servers are listed; a server reclaimed
    before any listing saw it left its REQUESTED record live (counted toward the
    target) until the 5-minute timeout. It is closed after the listing grace and the
    partition creates again."""
    from sco.ports import CreateResult
    from sco_harness.fakes import RecordingProvider

    w = World(tmp_path)

    class Vanishing(RecordingProvider):
        armed = True

        def create(self, pool: str, count: int, request_id: str, partition: str, gen: int):  # type: ignore[no-untyped-def]
            result = super().create(pool, count, request_id, partition, gen)
            if self.armed:
                self.inner.delete(result.server_ids)  # reclaimed at once, unseen
            return CreateResult((), pending=len(result.server_ids))

    provider = Vanishing(w.region)
    c = w.controller(provider)
    c.cycle()  # 3 requested; the servers go before anyone looks
    provider.armed = False
    w.at(30.0)
    assert c.cycle().created == 0  # within the grace: a server may yet show up
    assert sum(1 for i in w.records() if i.state is State.REQUESTED) == 3
    w.at(61.0)
    assert c.cycle().created == 3  # closed, and asked for again
    w.at(300.0)
    c.cycle()
    w.at(330.0)
    c.cycle()
    assert [i.state for i in w.records()] == [State.READY] * 3


def test_a_young_server_reclaimed_after_it_ran_is_seen_gone_at_once(tmp_path: Path) -> None:
    """Regression: the listing grace (for creates not yet listed) also hid the reclaim
    of a server that had been listed and was running, if it was under a minute old:
    its replacement waited a minute."""
    w = World(tmp_path, sim=SimConfig(cold_start_s=10.0, delete_s=1.0))
    c = w.controller()
    for t in (0.0, 5.0, 15.0):
        w.at(t)
        c.cycle()
    ready = [i for i in w.records() if i.state is State.READY]
    assert len(ready) == 3
    assert ready[0].server_id is not None
    w.region.delete([ready[0].server_id])  # taken back, 15 s after it was created
    w.at(20.0)
    report = c.cycle()
    assert report.created == 1, "replaced now, not a minute later"
    history = w.store.history(ready[0].id)
    assert history[-1].trigger == "server_vanished"


class NotedNodes:
    """The region's node plane, with a scheduler's note on every node."""

    def __init__(self, region: SimRegion) -> None:
        self.region = region

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        views = self.region.nodes(partition)
        return {
            s: dataclasses.replace(v, note="job 7 cannot be requeued") for s, v in views.items()
        }

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.region.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.region.drain(partition, server_id, drain_by, reason)


def test_what_a_node_s_leaving_cuts_short_is_in_its_last_event(tmp_path: Path) -> None:
    # Pool a loses its capacity at t=600 with 120 s notice: its servers drain and go.
    w = World(tmp_path, target=4, sim=SimConfig(notice_s=120), a_trace=[4] + [0] * 49)
    c = w.controller(nodes=NotedNodes(w.region))
    for t in range(0, 1230, 30):
        w.at(float(t))
        c.cycle()
    last: dict[str, HistoryRow] = {}
    for row in w.store.history():
        last[row.instance_id] = row
    gone_from_a = [r for r in last.values() if r.pool.endswith("/a") and r.to_state == "gone"]
    assert gone_from_a, last
    assert all("job 7 cannot be requeued" in r.reason for r in gone_from_a), gone_from_a


class ForgetfulNodes:
    """The region's node plane, but the scheduler no longer lists some servers' nodes, as
    a slurmctld that lost their registration in a crash."""

    def __init__(self, region: SimRegion) -> None:
        self.region = region
        self.forgotten: set[str] = set()

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        views = self.region.nodes(partition)
        return {s: v for s, v in views.items() if s not in self.forgotten}

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.region.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.region.drain(partition, server_id, drain_by, reason)


def _forgetful_world(
    tmp_path: Path, target: int
) -> tuple[World, PartitionController, ForgetfulNodes]:
    """A partition at target, READY, whose scheduler may forget nodes (60 s grace)."""
    w = World(tmp_path, target=target)
    forgetful = ForgetfulNodes(w.region)
    c = w.controller(nodes=forgetful, config=ControllerConfig(node_lost_after_s=60.0))
    c.cycle()
    w.at(150.0)
    c.cycle()
    return w, c, forgetful


def test_a_ready_node_its_scheduler_lost_is_failed_deleted_and_replaced(tmp_path: Path) -> None:
    w, c, forgetful = _forgetful_world(tmp_path, target=2)
    ready = [i for i in w.records() if i.state is State.READY]
    assert len(ready) == 2
    lost = ready[0]
    assert lost.server_id is not None
    forgetful.forgotten.add(lost.server_id)
    for t in (165.0, 180.0, 195.0):  # within the grace: a scheduler may blink
        w.at(t)
        assert c.cycle().created == 0
    assert w.store.instance(lost.id).state is State.READY
    w.at(225.0)
    report = c.cycle()
    assert report.created == 1, "replaced once the grace has passed"
    rows = w.store.history(lost.id)
    assert [(r.to_state, r.trigger) for r in rows[-2:]] == [
        ("failed", "node_lost"),
        ("terminating", "delete_sent"),
    ]
    assert "not listed, or down" in rows[-2].reason
    w.at(400.0)
    c.cycle()
    assert w.store.instance(lost.id).state is State.GONE
    assert lost.server_id not in {s.server_id for s in w.region.list("p1")}
    assert sum(1 for i in w.records() if i.state is State.READY) == 2


def test_a_node_back_in_its_scheduler_within_the_grace_stays(tmp_path: Path) -> None:
    w, c, forgetful = _forgetful_world(tmp_path, target=1)
    (node,) = w.records()
    assert node.server_id is not None
    forgetful.forgotten.add(node.server_id)
    w.at(180.0)
    c.cycle()
    forgetful.forgotten.clear()
    w.at(200.0)
    c.cycle()
    forgetful.forgotten.add(node.server_id)  # lost again: the grace starts over
    w.at(230.0)
    c.cycle()
    w.at(250.0)
    assert c.cycle().created == 0
    assert w.store.instance(node.id).state is State.READY


class _Undiscovered:
    """The region, its discovery missing one pool (an aggregate taken out of it)."""

    def __init__(self, region: SimRegion, missing: str) -> None:
        self.region = region
        self.missing = missing

    def pools(self) -> list[object]:
        return [p for p in self.region.pools() if p.id != self.missing]

    def __getattr__(self, name: str) -> object:
        return getattr(self.region, name)


def test_servers_in_a_pool_discovery_lost_are_kept_and_not_replaced(tmp_path: Path) -> None:
    # Regression (the swarm's pool_missing, seed 35): a controller made while discovery
    # missed a pool took its servers as surplus to every plan, replaced them elsewhere
    # and held more than max_units until the drains ended.
    w = World(tmp_path, target=3)
    c = w.controller()
    c.cycle()
    w.at(150.0)
    c.cycle()
    held = {i.pool for i in w.records() if i.state is State.READY}
    assert len([i for i in w.records() if i.state is State.READY]) == 3
    lost = sorted(held)[0]
    kept = {i.server_id for i in w.records() if i.pool == lost}
    later = w.controller(provider=_Undiscovered(w.region, lost))  # type: ignore[arg-type]
    for t in (160.0, 300.0, 450.0):
        w.at(t)
        report = later.cycle()
        assert (report.created, report.drained, report.deleted) == (0, 0, 0)
    assert {i.server_id for i in w.records() if i.pool == lost} == kept
    assert len([i for i in w.records() if i.state is State.READY]) == 3
    assert later.undiscovered == {lost}
