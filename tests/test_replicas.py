"""Several replicas sharing partitions through leases, on SQLite and on PostgreSQL.

The replicas run in this process on one simulated region and one manual
clock, stepped by the test, so a "kill" is a replica that stops being
stepped (its leases are not handed back) and a "pause" is one that resumes
later with what it believed before.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.leases import SqlLeases
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.lifecycle import State
from sco.domain.plans import Plan
from sco.engine import builder
from sco.engine.clock import ManualClock
from sco.engine.cycle import ControllerConfig, CycleReport
from sco.engine.replicas import ReplicaConfig, ReplicaRunner, fair_share
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco.ports import FencedOut, LeaseStore, Provider
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.runners import ports_of

PARTITIONS = 6


class Cluster:
    def __init__(self, tmp: Path, url: str) -> None:
        traces = tmp / "traces"
        for zone in ("a", "b", "c"):
            write_json_trace(traces, zone, [40] * 50, gap_s=600)
        write_yaml(traces / "region.yaml", {"halls": 3, "guaranteed_quota_per_hall": 10})
        demand = write_yaml(
            tmp / "demand.yaml",
            {
                "partitions": [
                    {"name": f"p{i}", "kind": "slurm", "target_units": 2, "max_units": 4}
                    for i in range(PARTITIONS)
                ]
            },
        )
        self.region = SimRegion(load_traces(traces), SimConfig())
        self.clock = ManualClock(0.0)
        self.url = url
        self.demand = FileDemandSource.load(demand, "traces", 0.0)
        self.replicas: dict[str, ReplicaRunner] = {}
        self.stores: dict[str, SqlFleetStore] = {}  # each replica's own connection

    def start(
        self,
        name: str,
        provider: Provider | None = None,
        interval_s: float = 5,
        on_report: Callable[[CycleReport], None] | None = None,
        calls: int = 0,
        leases: Callable[[SqlLeases], LeaseStore] | None = None,
    ) -> ReplicaRunner:
        """A new process: its own store connection, nothing in memory; the region is
        its provider unless another is given; its leases in the database unless
        `leases` pairs the database's fencing with a table kept elsewhere."""
        store = SqlFleetStore(self.url)
        fencing = SqlLeases(store.engine)
        ports = ports_of(
            provider or self.region,
            self.region,
            store,
            self.demand,
            self.clock,
            leases=leases(fencing) if leases is not None else fencing,
            calls=calls,
        )
        runner = builder.replica(
            ports,
            ReplicaConfig(name, lease_ttl_s=15, lease_every_s=1, act_margin_s=5),
            lambda: ScoPolicy(HedgeConfig(max_spare=0)),
            interval_s,
            controller=ControllerConfig(),
            on_report=on_report,
        )
        self.replicas[name] = runner
        self.stores[name] = store
        return runner

    def step(self, dt: float, alive: list[str]) -> None:
        """`dt` seconds, one second at a time: leases every second, cycles every 5."""
        for _ in range(int(dt)):
            t = self.clock.now() + 1
            self.region.advance_to(t)
            self.clock.set(t)
            for name in alive:
                r = self.replicas[name]
                r.tend_leases()
                if int(t) % 5 == 0:
                    for n in r.actable():
                        if n in r.controllers:
                            report = r.controllers[n].cycle()
                            if r.metrics is not None:
                                r.metrics.observe(report)

    def holders(self) -> Counter[str]:
        leases = SqlLeases(SqlFleetStore(self.url, run_migrations=False).engine).leases()
        return Counter(x.holder for x in leases if x.expires_at >= self.clock.now())


def test_fair_share() -> None:
    assert fair_share(12, 3) == 4
    assert fair_share(12, 5) == 3
    assert fair_share(3, 0) == 3


def test_replicas_share_partitions_and_take_over_a_dead_one(tmp_path: Path, fleet_url: str) -> None:
    c = Cluster(tmp_path, fleet_url)
    for name in ("r1", "r2", "r3"):
        c.start(name)
    c.step(200, ["r1", "r2", "r3"])
    assert sorted(c.holders().values()) == [2, 2, 2], c.holders()
    ready = [i for p in range(PARTITIONS) for i in c.stores["r1"].instances(f"p{p}")]
    assert sum(1 for i in ready if i.state is State.READY) == 2 * PARTITIONS

    # r3 dies: no release, its leases lapse after the TTL and the others take them.
    orphaned = {p for p, lease in c.replicas["r3"].held.items()}
    killed_at = c.clock.now()
    taken_at = None
    for _ in range(30):
        c.step(1, ["r1", "r2"])
        holders = {
            x.partition: x.holder
            for x in SqlLeases(c.stores["r1"].engine).leases()
            if x.expires_at >= c.clock.now()
        }
        if all(holders.get(p) in ("r1", "r2") for p in orphaned):
            taken_at = c.clock.now()
            break
    assert taken_at is not None
    assert taken_at - killed_at <= 15 + 1  # the TTL, and the next lease round
    c.step(30, ["r1", "r2"])
    # The first to see the orphans took them all; a TTL later it hands back its extra.
    assert sorted(c.holders().values()) == [3, 3]
    servers = c.region.server_count()
    assert servers == 2 * PARTITIONS, "nothing created twice across the takeover"


def test_a_paused_replica_cannot_write_after_takeover(tmp_path: Path, fleet_url: str) -> None:
    c = Cluster(tmp_path, fleet_url)
    paused = c.start("paused")
    c.step(10, ["paused"])
    assert len(paused.held) == PARTITIONS
    c.start("other")
    c.step(20, ["other"])  # "paused" sleeps through its TTL; "other" takes over
    assert c.holders() == Counter({"other": PARTITIONS})
    # "paused" wakes up and, before it tends its leases, runs a cycle on what it
    # believed: the database refuses its writes, so it reserves nothing, creates
    # nothing, deletes nothing.
    history = len(c.stores["other"].history())
    servers = c.region.server_count()
    for controller in paused.controllers.values():
        controller.records.forget()  # it reloads, plans again and tries to act
        with contextlib.suppress(FencedOut):  # a first write refused stops it there
            controller.cycle()
    assert len(c.stores["other"].history()) == history
    assert c.region.server_count() == servers
    name = next(iter(paused.controllers))
    with pytest.raises(FencedOut):
        c.stores["paused"].save_plan(Plan(name, 99, c.clock.now(), {}, {}), paused.token(name))
    # its next lease round tells it it lost everything
    paused.tend_leases()
    assert paused.held == {}


def test_a_rolling_change_of_lease_kind_hands_over_once(tmp_path: Path, fleet_url: str) -> None:
    """Issue 40, defect 7: during a rollout from leases in the database to Kubernetes
    Leases, the new kind's claim of a partition's fence was a lease row that had
    expired already: the old kind took it, the new claimed above it, and the two fenced
    each other every TTL, both acting in between. The claim now holds as long as the
    Lease: the old replica keeps what it holds until it goes, then the new takes it
    over once, and nobody is fenced."""
    from sco.engine.leases import PairedLeases
    from sco.lab.twins.leases import KubeLeases

    c = Cluster(tmp_path, fleet_url)
    kube = KubeLeases()  # the cluster's Leases, shared by every new replica
    c.start("old")
    c.step(10, ["old"])
    c.start("new", leases=lambda fencing: PairedLeases(kube, fencing))
    seen: list[dict[str, str]] = []
    for _ in range(120):
        c.step(1, ["old", "new"])
        seen.append({x.partition: x.holder for x in c.replicas["old"].leases.leases()})
    assert all(s == seen[0] for s in seen), "no partition changed hands while both ran"
    assert set(c.replicas["old"].held) == {f"p{i}" for i in range(PARTITIONS)}
    assert c.replicas["new"].held == {}
    c.step(40, ["new"])  # the old replica is gone: its leases lapse, the new takes them
    assert set(c.replicas["new"].held) == {f"p{i}" for i in range(PARTITIONS)}
    c.step(60, ["new"])
    assert c.replicas["old"].fenced == {}
    assert c.replicas["new"].fenced == {}
    assert c.holders() == Counter({"new": PARTITIONS})
    servers = c.region.server_count()
    assert servers == 2 * PARTITIONS, "nothing created twice across the hand-over"


def test_database_loss_stops_acting(tmp_path: Path, fleet_url: str) -> None:
    c = Cluster(tmp_path, fleet_url)
    r = c.start("solo")
    c.step(10, ["solo"])
    assert len(r.held) == PARTITIONS

    class Down:
        def __getattr__(self, name: str) -> object:
            def fail(*_a: object, **_k: object) -> None:
                raise ConnectionError("database is down")

            return fail

    working = r.leases
    r.leases = Down()  # type: ignore[assignment]
    r.tend_leases()
    assert r.held == {}
    assert r.actable() == []
    r.leases = working
    r.tend_leases()  # back: the same leases, the same tokens
    assert len(r.held) == PARTITIONS
    assert {lease.token for lease in r.held.values()} == {1}


def test_placement_metrics_follow_the_partitions(tmp_path: Path, fleet_url: str) -> None:
    from prometheus_client import generate_latest

    from sco.engine.metrics import PlacementMetrics

    c = Cluster(tmp_path, fleet_url)
    r = c.start("solo")
    metrics = PlacementMetrics()
    r.metrics = metrics
    c.step(300, ["solo"])  # past the 120 s cold start

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    for p in range(PARTITIONS):
        assert value("sco_placement_state", partition=f"p{p}", state="placed") == 2
        assert value("sco_placement_state", partition=f"p{p}", state="unplaced") == 0
        assert value("sco_placement_state", partition=f"p{p}", state="mismatch") == 0
    delays = value("sco_placement_delay_seconds_count", partition="p0")
    assert delays == 2  # two instances became ready
    assert value("sco_placement_delay_seconds_sum", partition="p0") >= 2 * 120  # cold start
    text = generate_latest(metrics.registry).decode()
    assert 'sco_placement_state{partition="p0",state="placed"} 2.0' in text
    # What the alerts and the dashboard read: floor vs ready, the fleet, cost, leaders.
    assert value("sco_partition_ready_units", partition="p0") == 2
    floor = value("sco_partition_floor_units", partition="p0")
    assert floor is not None
    assert floor <= 2
    assert value("sco_partition_target_units", partition="p0") == 2
    by_class = {cls: value("sco_instances", partition="p0", **{"class": cls}, state="ready")
                for cls in ("spot", "guaranteed")}  # fmt: skip
    assert sum(v or 0 for v in by_class.values()) == 2
    cost = value("sco_partition_cost_per_hour", partition="p0")
    assert cost is not None
    assert cost > 0
    # When each partition's last cycle ended, by the replica's clock (the soak reads it).
    ended = value("sco_partition_last_cycle_timestamp_seconds", partition="p0")
    assert ended is not None
    assert c.clock.now() - 60 <= ended <= c.clock.now() + 1
    r.tend_leases()
    assert value("sco_partition_leader", partition="p0", replica="solo") == 1
    r._drop("p0", "released", "a test hands it back")
    assert value("sco_placement_state", partition="p0", state="placed") is None
    assert value("sco_partition_ready_units", partition="p0") is None
    assert value("sco_partition_last_cycle_timestamp_seconds", partition="p0") is None
    r.tend_leases()  # it takes p0 back (the only replica): a leader again
    assert value("sco_partition_leader", partition="p0", replica="solo") == 1


# ---------------------------------------------------------------- a full disk under the state

DISK_FULL = (
    "(sqlite3.OperationalError) database or disk is full\n"
    "[SQL: UPDATE leases SET expires_at=? WHERE partition = ?]\n"
    "[parameters: (1015.0, 'p0')]"
)


class _DiskFull(Exception):
    """Stands for SQLAlchemy's OperationalError on a full disk (its message's shape)."""


def test_a_full_disk_under_the_lease_store_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (fault matrix, issue 17): with the SQLite state's disk full the
    replica logged only "lease store unreachable (OperationalError)", which names
    neither the disk nor the state. Now the driver's own words are in that line (once,
    however long it lasts: not the statement or its parameters), and its end is said."""
    import logging

    c = Cluster(tmp_path, sqlite_url_of(tmp_path))
    r = c.start("solo")
    c.step(10, ["solo"])
    working = r.leases

    class Full:
        def __getattr__(self, name: str) -> object:
            def fail(*_a: object, **_k: object) -> None:
                raise _DiskFull(DISK_FULL)

            return fail

    caplog.set_level(logging.INFO, logger="sco.engine.replicas")
    r.leases = Full()  # type: ignore[assignment]
    for _ in range(5):
        r.tend_leases()
    assert r.held == {}
    assert not r.ready()[0]
    said = [m for m in caplog.messages if "lease store unreachable" in m]
    assert said == [
        "replica solo: lease store unreachable (_DiskFull: (sqlite3.OperationalError) "
        "database or disk is full); stopping all partitions"
    ]
    assert "parameters" not in caplog.text
    r.leases = working
    r.tend_leases()
    assert len(r.held) == PARTITIONS
    assert any("lease store reachable again" in m for m in caplog.messages)


def sqlite_url_of(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'fleet.db'}"


def test_a_cycle_failing_the_same_way_logs_its_traceback_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression (fault matrix, issue 17): a partition whose cycle fails on every
    interval (its writes refused by a full disk) logged a whole traceback each time.
    Now: the traceback once, then one line per failed cycle, and a line when cycles
    succeed again."""
    import logging
    import threading
    import time

    from sco.engine.loops import PartitionLoops

    failures = 4
    done = threading.Event()

    class Controller:
        calls = 0

        def cycle(self) -> object:
            self.calls += 1
            if self.calls <= failures:
                raise _DiskFull(DISK_FULL)
            done.set()
            return object()

    caplog.set_level(logging.INFO, logger="sco.engine.loops")
    loops = PartitionLoops(0.01)
    loops.start("p0", Controller())  # type: ignore[arg-type]
    try:
        assert done.wait(10)
        time.sleep(0.05)
    finally:
        loops.stop_all(wait_s=5)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1
    assert "database or disk is full" in tracebacks[0].getMessage()
    again = [m for m in caplog.messages if "cycle failed again" in m]
    assert len(again) == failures - 1
    assert again[-1].startswith(f"partition p0: cycle failed again ({failures} in a row)")
    assert "cycles succeed again after 4 failed" in caplog.text


def test_a_dead_replicas_leases_are_all_taken_at_their_expiry(
    tmp_path: Path, fleet_url: str
) -> None:
    """Soak (issue 17): a replica killed with SIGKILL left its partitions leaderless up
    to 2.4 s past the lease TTL: the replica with room took one lease per controller it
    built (a second lease waited for the first controller), and looked only at its
    next tend interval. Now it takes every lease it may before building controllers,
    and its next tend is at the first expiry of a lease held elsewhere."""
    c = Cluster(tmp_path, fleet_url)
    for name in ("r1", "r2", "r3"):
        c.start(name)
    c.step(60, ["r1", "r2", "r3"])
    r1, r3 = c.replicas["r1"], c.replicas["r3"]
    orphaned = set(r3.held)
    assert len(orphaned) == 2
    expiry = max(r3.held[p].expires_at for p in orphaned)
    r1.leases.forget_replica("r2")  # r2 and r3 both gone: r1 has room for all six
    c.replicas["r2"].shutdown()
    r1.tend_leases()
    # Not yet expired: r1 knows when to look again.
    assert r1._until_next_tend() == pytest.approx(min(1.0, expiry - c.clock.now() + 0.01))
    built: list[str] = []
    make_controller = r1._controller

    def controller(partition, fence):  # type: ignore[no-untyped-def]
        # When each controller is built, every lease taken this round is already held.
        built.append(partition.name)
        assert orphaned <= set(r1.held), (partition.name, set(r1.held))
        return make_controller(partition, fence)

    r1._controller = controller
    c.clock.set(expiry + 0.01)
    r1.leases.forget_replica("r3")
    r1.tend_leases()
    assert orphaned <= set(r1.held)
    assert orphaned <= set(built)
    assert r1._until_next_tend() == 1.0  # nothing held elsewhere now


def test_a_dead_replicas_leases_are_rescued_beyond_the_share_while_its_successor_starts(
    tmp_path: Path, fleet_url: str
) -> None:
    """Issue 25 (bench/chaos.py measured a worst takeover of 16.9 s for a 15 s TTL): a
    killed replica's successor joins the membership before it can take anything, so
    the survivors, at their fair share, left the dead one's partitions to it. Now a
    lease that expired unreleased is an orphan any replica takes at once, beyond its
    share, and hands back a TTL later when the successor has room."""
    c = Cluster(tmp_path, fleet_url)
    for name in ("r1", "r2", "r3"):
        c.start(name)
    c.step(60, ["r1", "r2", "r3"])
    orphaned = set(c.replicas["r3"].held)
    assert len(orphaned) == 2
    expiry = max(c.replicas["r3"].held[p].expires_at for p in orphaned)
    successor = c.start("r4")  # alive, but slow to start: it heartbeats and takes nothing
    killed_at = c.clock.now()
    taken_at = None
    while c.clock.now() < killed_at + 20:
        c.step(1, ["r1", "r2"])
        successor.leases.heartbeat("r4", 5, c.clock.now())
        holders = {x.partition: x.holder for x in successor.leases.leases()}
        if taken_at is None and all(holders[p] in ("r1", "r2") for p in orphaned):
            taken_at = c.clock.now()
    assert taken_at is not None
    assert taken_at <= expiry + 1.0, (taken_at, expiry)
    c.step(40, ["r1", "r2", "r4"])  # the successor is up: the extras are handed to it
    assert sorted(c.holders().values()) == [2, 2, 2]


def test_every_lease_hand_over_says_why(
    tmp_path: Path, fleet_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28: a replica that handed a lease to another logged no reason."""
    c = Cluster(tmp_path, fleet_url)
    with caplog.at_level(logging.INFO, logger="sco.engine.replicas"):
        for name in ("r1", "r2", "r3"):
            c.start(name)
        c.step(60, ["r1", "r2", "r3"])
        c.step(60, ["r1", "r2"])  # r3 dies without a word
        c.replicas["r1"].shutdown()
    lines = [r.getMessage() for r in caplog.records if " lease of " in r.getMessage()]
    assert lines
    assert all(re.search(r"\(token \d+\): \S", line) for line in lines), lines
    said = "\n".join(lines)
    assert "never held before" in said
    assert "r3 let it expire" in said  # the orphans r1 or r2 rescued
    assert "above this replica's fair share" in said  # and handed back a TTL later
    assert "this replica is stopping" in said


def test_a_create_answered_while_the_lease_lapsed_is_recorded_when_it_is_retaken(
    tmp_path: Path, fleet_url: str
) -> None:
    # Regression (the swarm, seed 1577): a slow cloud held a replica past its leases'
    # TTL; it took them again and made new controllers, and the answer of a create the
    # old one had sent was dropped with it. The server was reclaimed before any listing
    # showed it, and its records were closed at the listing grace as "no server was
    # created": a server sco made that no record names.
    from test_calls import HeldCalls

    c = Cluster(tmp_path, fleet_url)
    calls = HeldCalls()
    runner = c.start("r1", calls=calls)  # type: ignore[arg-type]
    c.step(5, ["r1"])  # the leases, then a first cycle: its creates wait for workers
    assert calls.held
    first = dict(runner.controllers)
    c.step(20, [])  # the replica stalls past its leases' TTL
    calls.run()  # the cloud makes the servers (not listed yet)
    made = {sid for _, answer, _ in calls.ran for sid in answer.result.server_ids}
    assert made
    calls.answer()  # the answers are back
    for sid in made:  # reclaimed before any listing
        c.region.give_notice(sid, c.clock.now() + 1)
    c.step(70, ["r1"])  # it takes its leases again, with new controllers
    assert all(runner.controllers[n] is not first[n] for n in first)
    named = {sid for _, sid, _ in c.stores["r1"].lives() if sid}
    assert made <= named
