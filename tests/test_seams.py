"""Regression tests for where two parts of the control plane meet (issue 25): a
reclaim notice on a draining node, a dry run on real schedulers, deadline work while
the cloud is away, a refused write after a drain."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.contracts import terms_of
from sco.domain.demand import HANDBACK
from sco.domain.instances import Change, Instance
from sco.domain.lifecycle import State
from sco.engine.clock import ManualClock
from sco.engine.cycle import ControllerConfig
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import (
    FencedOut,
    NodeView,
    RetryableProviderError,
    ServerView,
    StateConflict,
)
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.runners import controller_of, ports_of


@dataclass
class Told:
    """The region's node plane, with every drain and every `tend` written down."""

    region: SimRegion
    drains: list[tuple[str, float, str]] = field(default_factory=list)
    tended: list[bool] = field(default_factory=list)  # whether each had a listing

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return self.region.nodes(partition)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self.tended.append(servers is not None)
        self.region.tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self.drains.append((server_id, drain_by, reason))
        self.region.drain(partition, server_id, drain_by, reason)


class Unlisting:
    """The region as a provider whose listing fails while `down` (an open breaker, an
    expired credential)."""

    def __init__(self, region: SimRegion) -> None:
        self.region = region
        self.down = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.region, name)

    def list(self, partition: str) -> Sequence[ServerView]:
        if self.down:
            raise RetryableProviderError("cloud unreachable")
        return self.region.list(partition)


class Refusing(SqlFleetStore):
    """Fleet state that refuses the next `record` with `refusal`."""

    refusal: StateConflict | None = None

    def record(
        self, changes: Sequence[Change], settle: Mapping[str, int] | None = None, fence: int = 0
    ) -> None:
        if self.refusal is not None and changes:
            refusal, self.refusal = self.refusal, None
            raise refusal
        super().record(changes, settle, fence)


class World:
    """Two spot pools, one partition of `target` nodes, a notice-less region."""

    def __init__(self, tmp: Path, target: int = 2) -> None:
        traces = tmp / "traces"
        write_json_trace(traces, "a", [4] * 50, gap_s=600)
        write_json_trace(traces, "b", [4] * 50, gap_s=600)
        write_yaml(traces / "region.yaml", {"halls": 2, "guaranteed_quota_per_hall": 2})
        demand = write_yaml(
            tmp / "demand.yaml",
            {
                "partitions": [
                    {"name": "p1", "kind": "slurm", "target_units": target, "max_units": 10}
                ]
            },
        )
        self.region = SimRegion(load_traces(traces), SimConfig(drain_s=10.0))
        self.provider = Unlisting(self.region)
        self.nodes = Told(self.region)
        self.clock = ManualClock(0.0)
        self.store = Refusing(sqlite_url(tmp / "state.db"))
        self.store.upsert_pools(self.region.pools())
        self.demand = FileDemandSource.load(demand, "traces", 0.0)
        self.ports = ports_of(
            self.provider,  # type: ignore[arg-type]
            self.nodes,
            self.store,
            self.demand,
            self.clock,
        )
        self.controller = controller_of(
            self.ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)), ControllerConfig()
        )

    def at(self, t: float) -> None:
        self.region.advance_to(t)
        self.clock.set(t)

    def ready(self) -> list[Instance]:
        """Cycle until the partition is at target, READY."""
        for t in range(0, 600, 30):
            self.at(float(t))
            self.controller.cycle()
        got = self.store.instances("p1")
        assert [i.state for i in got] == [State.READY] * len(got)
        return got

    def one(self, instance_id: str) -> Instance:
        (got,) = [i for i in self.store.instances("p1") if i.id == instance_id]
        return got


def test_a_reclaim_notice_on_a_draining_node_brings_its_deadline_forward(
    tmp_path: Path,
) -> None:
    """Defect 1: the notice was dropped (no edge out of DRAINING), so the node was never
    told of the reclaim, its work never requeued, and the contract never said so."""
    w = World(tmp_path)
    first, _ = w.ready()
    assert first.server_id is not None
    w.store.put_intent("p1", HANDBACK, 600.0, "test")  # sco drains everything (60 s)
    w.at(600.0)
    w.controller.cycle()
    leaving = w.one(first.id)
    assert leaving.state is State.DRAINING
    assert leaving.drain_by == 660.0
    assert w.nodes.drains[-1][2] == "handback"
    w.region.give_notice(first.server_id, 630.0)  # the cloud wants it back sooner
    w.at(605.0)
    w.controller.cycle()
    told = w.one(first.id)
    assert told.state is State.DRAINING
    assert told.notice_deadline == 630.0
    assert told.drain_by == 630.0
    assert (first.server_id, 630.0, "reclaim_notice") in w.nodes.drains
    assert terms_of(told).reclaim, "the agent is told it is a reclaim: it may requeue"
    assert terms_of(told).drain_by == 630.0
    history = [(r.from_state, r.to_state, r.trigger) for r in w.store.history(first.id)]
    assert ("draining", "noticed", "reclaim_notice") in history


def test_a_sooner_second_notice_wins_and_a_later_one_changes_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    first, _ = w.ready()
    assert first.server_id is not None
    w.region.give_notice(first.server_id, 900.0)
    w.at(600.0)
    reclaims = sum(w.controller.cycle().reclaims.values())
    assert w.one(first.id).drain_by == 900.0
    assert w.region.give_notice(first.server_id, 1200.0) == 900.0  # a notice never moves later
    w.region.give_notice(first.server_id, 700.0)
    w.at(630.0)
    reclaims += sum(w.controller.cycle().reclaims.values())
    now = w.one(first.id)
    assert (now.state, now.notice_deadline, now.drain_by) == (State.DRAINING, 700.0, 700.0)
    assert w.nodes.drains[-1] == (first.server_id, 700.0, "reclaim_notice")
    assert reclaims == 1, "one reclaim, however many notices"


def test_the_scheduler_side_keeps_time_while_the_cloud_cannot_be_listed(tmp_path: Path) -> None:
    """Defect 3: a listing error returned from the cycle before the node plane ran, so no
    requeue or DOWN happened at a reclaim's deadline."""
    w = World(tmp_path)
    w.ready()
    w.provider.down = True
    w.at(600.0)
    report = w.controller.cycle()
    assert report.degraded.startswith("observe failed")
    assert w.nodes.tended[-1] is False, "tended without a listing"


def test_a_drain_whose_record_is_refused_reaches_no_scheduler(tmp_path: Path) -> None:
    """Defect 5: the drain was sent before its record was written; a conflict left the
    node drained while sco counted it READY toward the floor."""
    w = World(tmp_path)
    w.ready()
    w.store.put_intent("p1", HANDBACK, 600.0, "test")
    w.store.refusal = StateConflict("someone else wrote")
    w.at(600.0)
    w.controller.cycle()
    assert w.nodes.drains == []
    assert {i.state for i in w.store.instances("p1")} == {State.READY}
    assert not any(v.leaving for v in w.region.nodes("p1").values())
    w.at(630.0)
    w.controller.cycle()  # reloaded: drained now, record first
    assert {i.state for i in w.store.instances("p1")} == {State.DRAINING}
    assert len(w.nodes.drains) == 2


def test_a_drain_the_scheduler_missed_is_told_again(tmp_path: Path) -> None:
    """A draining record whose node does not hold the order (the scheduler was away when
    it was sent, or a restarted plane lost it) is told again."""
    w = World(tmp_path)
    first, _ = w.ready()
    w.store.put_intent("p1", HANDBACK, 600.0, "test")
    w.at(600.0)
    real = w.nodes.drain
    w.nodes.drain = lambda *a, **k: None  # type: ignore[method-assign]  # lost on the way
    w.controller.cycle()
    assert w.one(first.id).state is State.DRAINING
    w.nodes.drain = real  # type: ignore[method-assign]
    w.at(610.0)
    w.controller.cycle()
    assert {d[2] for d in w.nodes.drains} == {"drain_untold"}
    assert all(v.leaving for v in w.region.nodes("p1").values())


def test_a_fenced_write_stops_the_controller(tmp_path: Path) -> None:
    """Defect 4: FencedOut (a StateConflict) was swallowed and the controller kept
    cycling and acting; now it reaches the runner, which drops the partition."""
    w = World(tmp_path)
    w.ready()
    w.store.put_intent("p1", HANDBACK, 600.0, "test")
    w.store.refusal = FencedOut("stale fencing token 3 for p1")
    w.at(600.0)
    with pytest.raises(FencedOut):
        w.controller.cycle()
    assert w.nodes.drains == []


def test_a_replica_fenced_out_stops_the_partition_and_says_so(tmp_path: Path) -> None:
    """Defect 4: a replica whose writes the database refuses drops the partition (no
    more actions, no leader metric) and, refused again and again, is not ready."""
    from prometheus_client import CollectorRegistry

    from sco.adapters.sqlstate.leases import SqlLeases
    from sco.engine import builder
    from sco.engine.leases import PairedLeases
    from sco.engine.metrics import PlacementMetrics
    from sco.engine.replicas import FENCED_STALL, ReplicaConfig
    from sco.lab.twins.leases import KubeLeases

    w = World(tmp_path)
    registry = CollectorRegistry()
    fencing = SqlLeases(w.store.engine)
    # Leases kept elsewhere (Kubernetes), fencing in the database.
    ports = dataclasses.replace(w.ports, leases=PairedLeases(KubeLeases(), fencing))
    runner = builder.replica(
        ports,
        ReplicaConfig("r1", lease_ttl_s=15, lease_every_s=1, act_margin_s=5),
        lambda: ScoPolicy(HedgeConfig(max_spare=0)),
        5,
        metrics=PlacementMetrics(registry),
    )
    runner.tend_leases()
    assert runner.cycle_once("p1") is not None
    w.store.put_intent("p1", HANDBACK, 0.0, "test")  # every cycle now has writes to make
    for k in range(FENCED_STALL):
        assert runner.ready()[0]
        w.at(w.clock.now() + 5)
        runner.tend_leases()  # its lease (kept elsewhere) renews, or is taken again
        assert "p1" in runner.held
        # Another writer claims a newer token in the database (with its own lease,
        # taken while r1's claim looked lapsed to it), and lets it lapse at once.
        fencing.claim_fence("p1", "intruder", 100 + k, until=-1.0, now=math.inf)
        assert runner.cycle_once("p1") is None  # its write is refused
        assert "p1" not in runner.held
    assert runner.fenced == {"p1": FENCED_STALL}
    assert registry.get_sample_value("sco_partition_fenced_total", {"partition": "p1"}) == 3
    assert w.nodes.drains == [], "no scheduler was told anything by a fenced controller"
    assert registry.get_sample_value(
        "sco_partition_leader", {"partition": "p1", "replica": "r1"}
    ) in (None, 0.0)
    ok, why = runner.ready()
    assert not ok
    assert "p1" in why
    assert "refused" in why


def test_a_sync_that_loses_its_race_looks_again_and_never_plans_from_nothing(
    tmp_path: Path,
) -> None:
    """Found by the swarm (issue 25): when the sync's write lost its race the records
    were dropped and the cycle planned on an empty partition: it reserved capacity for
    every target, then failed an assertion before creating (a traceback every time)."""
    w = World(tmp_path)
    first, _ = w.ready()
    assert first.server_id is not None
    w.region.give_notice(first.server_id, 900.0)
    w.store.refusal = StateConflict("someone else wrote")  # the notice's transition loses
    w.at(600.0)
    report = w.controller.cycle()  # no AssertionError
    assert report.degraded == ""
    assert w.one(first.id).state is State.DRAINING, "seen again in the same cycle"
    assert w.region.server_count() == 3, "one replacement, not a partition's worth"


def test_a_create_whose_outcome_loses_its_race_stops_the_cycle_s_creates(tmp_path: Path) -> None:
    """Found by the swarm (issue 25): the first create's outcome lost its race, the
    records were dropped, and the next create of the cycle failed an assertion."""
    w = World(tmp_path, target=4)
    w.store.refusal = StateConflict("someone else wrote")  # the first outcome loses
    report = w.controller.cycle()  # no AssertionError
    assert report.created <= 2
    w.at(30.0)
    w.controller.cycle()
    w.at(90.0)
    w.controller.cycle()
    assert w.region.server_count() == 4, "nothing lost, nothing twice"


def test_a_create_answered_slowly_keeps_its_listing_grace(tmp_path: Path) -> None:
    """Found by the swarm (issue 25): with a slow cloud the create was answered long
    after the cycle began, and the records were stamped with the cycle's start; the
    next cycle found the listing grace spent before the server could be listed, closed
    the record as vanished, then adopted the server as a stranger and deleted it."""
    w = World(tmp_path, target=1)
    region_create = w.region.create

    def slow_create(*args: object, **kwargs: object) -> object:
        w.at(w.clock.now() + 70.0)  # the answer comes 70 s later (the grace is 60 s)
        return region_create(*args, **kwargs)  # type: ignore[arg-type]

    w.region.create = slow_create  # type: ignore[method-assign]
    w.controller.cycle()
    (inst,) = w.store.instances("p1")
    assert inst.state is State.CREATING
    w.controller.cycle()  # at once: not listed yet (the cloud lists it a second later)
    w.at(w.clock.now() + 5.0)
    w.controller.cycle()
    assert [(i.id, i.state) for i in w.store.instances("p1")] == [(inst.id, State.CREATING)]
    assert w.region.server_count() == 1
