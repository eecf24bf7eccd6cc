"""The scheduler's rules: what Slurm answers to every call sco makes of it, once, over
every implementation that answers them:

- "slurmctld": `SlurmTools` (squeue, sinfo, scontrol) on a real slurmctld with dynamic
  slurmd nodes, each in a network namespace of its own (`sco_harness.slurm_cluster`);
- "replay": the lab's batch cluster the replay runs (`sco.lab.workload.cluster`);
- "swarm": the swarm's (`sco.lab.swarm.slurm.SimSlurm`: that cluster, with a
  slurmctld that may be away).

The calls are SlurmTools' that sco's controller (`SlurmView`, `SlurmNodes`,
`SlurmDemandSource`), its start-up check and its node agent (`SlurmDrain`) make:
partitions, nodes, jobs, jobs_on, hostnames, drain, down, requeue, start_now and
delete_node; the rules read them directly and through those readers. What the world
does besides (a server boots and its slurmd registers, a server goes, a user submits
a job) is each implementation's own (`Cluster`). A job here takes a whole node (the
lab's cluster runs one job a node) with a time limit of ten minutes.

Time: the real cluster schedules on its own, so every rule waits for what it expects
(`eventually`), a few minutes at most; the lab's clusters wait on their own clock.
Nothing is asserted of how long anything took. Slurm's accounting (`allocations`,
sacct) has no twin: `sco slurm usage` is tested on the real daemons (test_slurm.py).
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

import pytest

from sco.adapters.slurm.demand import SlurmDemandSource, SlurmDemandSpec
from sco.adapters.slurm.drain import SlurmDrain
from sco.adapters.slurm.model import Job, SlurmNode
from sco.adapters.slurm.nodes import SlurmNodes, SlurmPartition, SlurmView, node_features, node_name
from sco.adapters.slurm.tools import (
    ClusterTools,
    SlurmRefused,
    SlurmTools,
    SlurmUnavailable,
)
from sco.decide.binpack import Size
from sco.domain.contracts import Contract, NodeState, Terms
from sco.domain.demand import Partition, SchedulerKind
from sco.domain.times import utc
from sco.engine.clock import ManualClock, SystemClock
from sco.lab.swarm.slurm import SimSlurm
from sco.lab.workload.cluster import BatchCluster
from sco.lab.workload.swf import BatchJob
from sco.ports import Clock, NodeView, SchedulerUnavailable, ServerStatus, ServerView
from sco_harness.slurm_cluster import SlurmCluster

T = TypeVar("T")

CPUS, MEMORY_MB = 2, 1000  # a node's shape, and a job's: it takes the whole node
LIMIT_S = 600.0  # every job's time limit (sbatch -t 10)
SLURM_PARTITION = "batch"
PART = SlurmPartition("hpc", (SLURM_PARTITION,), Size(CPUS, MEMORY_MB), 20.0, 300.0)
FEATURES = node_features("hpc", "spot", "lab/hall-a/spot.small")


class SlurmCalls(Protocol):
    """What sco asks of Slurm (`SlurmTools`' calls), as the suite makes them."""

    def partitions(self) -> set[str]: ...
    def nodes(self) -> list[SlurmNode]: ...
    def jobs(self, partitions: Sequence[str]) -> list[Job]: ...
    def jobs_on(self, node: str) -> list[Job]: ...
    def hostnames(self, hostlist: str) -> list[str]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def down(self, node: str, reason: str) -> None: ...
    def requeue(self, job_ids: Sequence[int]) -> None: ...
    def start_now(self, job_ids: Sequence[int]) -> None: ...
    def delete_node(self, node: str) -> None: ...


@dataclass
class Cluster:
    """A Slurm cluster: sco's calls (`tools`), and the world's side of it."""

    tools: SlurmCalls
    register: Callable[[str, Sequence[str]], None]  # a server booted: its slurmd registers
    server_gone: Callable[[str], None]  # the server is gone, its slurmd with it
    submit: Callable[[float, bool], int]  # a whole-node job running so long; requeueable?
    clock: Clock
    sleep: Callable[[float], None]  # time passes (the lab's clusters schedule meanwhile)
    patience_s: float  # how long an answer may take to show
    away: Callable[[], contextlib.AbstractContextManager[None]] | None = None  # slurmctld
    servers: dict[str, str] = field(default_factory=dict)  # node -> its server's id

    def node(self) -> str:
        """A new node's name, as sco names the node of a new server."""
        server_id = str(uuid.uuid4())
        name = node_name(server_id)
        self.servers[name] = server_id
        return name

    def now(self) -> float:
        return self.clock.now()


def eventually(c: Cluster, check: Callable[[], T | None], what: str) -> T:
    """`check`'s answer once it has one (not None, not false)."""
    deadline = c.now() + c.patience_s
    while True:
        got = check()
        if got:
            return got
        if c.now() > deadline:
            raise AssertionError(f"{what}: not seen in {c.patience_s:.0f} s")
        c.sleep(0.5)


# ---------------------------------------------------------------- implementations


@pytest.fixture(scope="module")
def slurmctld(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(
        tmp_path_factory.mktemp("slurm"), partitions=(SLURM_PARTITION,), sco_partition="hpc",
        cpus=CPUS, memory_mb=MEMORY_MB,
    )  # fmt: skip
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _real(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster: SlurmCluster = request.getfixturevalue("slurmctld")
    # The tools' own timeout, longer than this machine takes under load: a tool that
    # cannot reach slurmctld tries for about 10 s before it says so.
    tools = SlurmTools(ClusterTools("main", cluster.conf, timeout_s=60.0))
    jobs: list[int] = []

    def submit(run_s: float, requeue: bool) -> int:
        flags = () if requeue else ("--no-requeue",)
        job = cluster.sbatch("-N1", f"-c{CPUS}", "-t", f"{LIMIT_S / 60:.0f}", *flags,
                             seconds=run_s)  # fmt: skip
        jobs.append(job)
        return job

    @contextlib.contextmanager
    def away() -> Iterator[None]:
        cluster.stop_ctld()
        try:
            yield
        finally:
            cluster.start_ctld()

    c = Cluster(tools, cluster.add_node, cluster.remove_node, submit, SystemClock(), time.sleep,
                patience_s=180.0, away=away)  # fmt: skip
    yield c
    cluster.start_ctld()  # a rule that failed with it away fails alone
    if jobs:
        subprocess.run(["scancel", *map(str, jobs)], env=cluster.env, capture_output=True,
                       check=False)  # fmt: skip
    for name in c.servers:
        cluster.remove_node(name)
        subprocess.run(["scontrol", "delete", f"nodename={name}"], env=cluster.env,
                       capture_output=True, check=False)  # fmt: skip


def _lab(make: Callable[[ManualClock], BatchCluster]) -> Callable[..., Iterator[Cluster]]:
    def implementation(_request: pytest.FixtureRequest) -> Iterator[Cluster]:
        clock = ManualClock(1_800_000_000.0)
        cluster = make(clock)
        ids = itertools.count(1)

        def submit(run_s: float, requeue: bool) -> int:
            job = BatchJob(next(ids), clock.now(), 1, run_s, LIMIT_S)
            cluster.submit(job, requeue)
            return job.job_id

        def sleep(dt_s: float) -> None:
            clock.advance(dt_s)
            cluster.step()

        def register(name: str, features: Sequence[str]) -> None:
            cluster.register(name, frozenset(features))

        away = None
        if isinstance(cluster, SimSlurm):
            swarm = cluster

            @contextlib.contextmanager
            def away_() -> Iterator[None]:
                swarm.available = False
                try:
                    yield
                finally:
                    swarm.available = True

            away = away_
        yield Cluster(cluster, register, cluster.server_gone, submit, clock, sleep,
                      patience_s=600.0, away=away)  # fmt: skip

    return implementation


IMPLEMENTATIONS = {
    "slurmctld": _real,
    "replay": _lab(
        lambda clock: BatchCluster("lab", Size(CPUS, MEMORY_MB), clock.now, PART.feature)
    ),
    "swarm": _lab(lambda clock: SimSlurm("swarm", CPUS, MEMORY_MB, clock.now, PART.feature)),
}


@pytest.fixture(params=list(IMPLEMENTATIONS))
def c(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    yield from IMPLEMENTATIONS[request.param](request)


# ---------------------------------------------------------------- reading it as sco does


def _node(c: Cluster, name: str) -> SlurmNode | None:
    return next((n for n in c.tools.nodes() if n.name == name), None)


def _node_when(c: Cluster, name: str, test: Callable[[SlurmNode], bool], what: str) -> SlurmNode:
    """The node as sinfo reads it, once `test` holds."""

    def check() -> SlurmNode | None:
        n = _node(c, name)
        return n if n is not None and test(n) else None

    return eventually(c, check, f"{name} {what}")


def _job(c: Cluster, job_id: int) -> Job | None:
    return next((j for j in c.tools.jobs([SLURM_PARTITION]) if j.job_id == job_id), None)


def _listing(c: Cluster) -> Callable[[str], Sequence[ServerView]]:
    """The provider's listing: a server for every node the rule registered."""

    def listing(_partition: str) -> Sequence[ServerView]:
        return [
            ServerView(sid, "hpc", "lab/hall-a/spot.small", "req", 1, ServerStatus.ACTIVE, 0.0)
            for sid in c.servers.values()
        ]

    return listing


def _tools(c: Cluster) -> SlurmTools:
    """The cluster's calls as sco's readers take them (the lab's answer them without
    being a `SlurmTools`)."""
    return cast(SlurmTools, c.tools)


def _view(c: Cluster) -> SlurmView:
    return SlurmView(_tools(c), [SLURM_PARTITION], ttl_s=0.0)


def _plane(c: Cluster) -> SlurmNodes:
    return SlurmNodes(_view(c), {"hpc": PART}, _listing(c), c.clock)


def _views(c: Cluster) -> dict[str, NodeView]:
    """The node plane's view, by node name."""
    by_server = _plane(c).nodes("hpc")
    return {name: by_server[sid] for name, sid in c.servers.items()}


def _demand(c: Cluster) -> int:
    spec = SlurmDemandSpec(Partition("hpc", "lab", SchedulerKind.SLURM), PART, 0, 8, 0)
    return SlurmDemandSource(_view(c), [spec], _listing(c)).demand("hpc", c.now()).target_units


def _up(c: Cluster, *names: str) -> None:
    """The nodes registered, idle and up."""
    for name in names:
        c.register(name, FEATURES)
    for name in names:
        _node_when(c, name, lambda n: n.up and n.state == "idle", "up and idle")


def _running(c: Cluster, *job_ids: int) -> dict[int, str]:
    """Where each job runs, once all of them run."""

    def where() -> dict[int, str] | None:
        jobs = [_job(c, j) for j in job_ids]
        if all(j and j.state == "RUNNING" and j.nodes for j in jobs):
            return {j.job_id: j.nodes[0] for j in jobs if j}
        return None

    return eventually(c, where, f"jobs {job_ids} running")


def _held_after_requeue(c: Cluster, job_id: int) -> Job:
    def held() -> Job | None:
        j = _job(c, job_id)
        return j if j is not None and j.held_after_requeue(c.now()) else None

    return eventually(c, held, f"job {job_id} pending again, held, with its restart counted")


def _clear(c: Cluster, name: str) -> None:
    """Nothing runs on the node any more."""
    eventually(c, lambda: not c.tools.jobs_on(name), f"{name} clear")


def _deadline(c: Cluster, in_s: float) -> tuple[float, str]:
    """A reclaim's deadline (whole seconds, as sco writes it) and the reason naming it."""
    at = float(int(c.now() + in_s))
    return at, f"sco: reclaim by {utc(at)}"


# ---------------------------------------------------------------- reading


def test_the_partitions_sco_is_configured_with_are_known(c: Cluster) -> None:
    assert SLURM_PARTITION in c.tools.partitions()


def test_a_node_that_registers_is_up_idle_with_its_features(c: Cluster) -> None:
    name = c.node()
    _up(c, name)
    n = _node(c, name)
    assert n is not None
    assert (n.state, n.busy, n.draining) == ("idle", False, False)
    assert set(FEATURES) <= n.features
    assert (n.cpus, n.memory_mb, n.alloc_cpus) == (CPUS, MEMORY_MB, 0)
    assert SLURM_PARTITION in n.partitions
    assert n.registered_at is not None
    view = _views(c)[name]
    assert (view.joined, view.drained, view.busy, view.leaving) == (True, False, False, False)


def test_a_job_is_demand_while_it_waits_then_runs_on_a_node(c: Cluster) -> None:
    job = c.submit(300.0, True)
    pending = eventually(c, lambda: _job(c, job), f"job {job} listed")
    assert (pending.state, pending.nodes, pending.end_time) == ("PENDING", (), None)
    assert pending.node_count == 1
    assert pending.per_node == Size(CPUS, MEMORY_MB)
    assert pending.requeue
    eventually(c, lambda: _demand(c) == 1, "a node of demand for the waiting job")
    name = c.node()
    c.register(name, FEATURES)
    assert _running(c, job) == {job: name}
    running = _job(c, job)
    assert running is not None
    assert running.end_time is not None
    assert running.end_time > c.now()  # by its time limit
    assert running.restarts == 0
    n = _node_when(c, name, lambda n: n.busy, "busy")
    assert (n.state, n.alloc_cpus) == ("allocated", CPUS)
    assert [j.job_id for j in c.tools.jobs_on(name)] == [job]
    assert _views(c)[name].busy
    assert _demand(c) == 1, "the busy node is still wanted"


def test_jobs_on_a_node_are_only_those_it_runs(c: Cluster) -> None:
    a, b = c.node(), c.node()
    _up(c, a, b)
    job = c.submit(300.0, True)
    on = _running(c, job)[job]
    other = b if on == a else a
    assert [j.job_id for j in c.tools.jobs_on(on)] == [job]
    assert c.tools.jobs_on(other) == []


def test_jobs_of_partitions_not_asked_for_are_not_listed(c: Cluster) -> None:
    job = c.submit(300.0, True)
    eventually(c, lambda: _job(c, job), f"job {job} listed")
    assert c.tools.jobs(["elsewhere"]) == []


def test_a_hostlist_is_its_node_names(c: Cluster) -> None:
    assert c.tools.hostnames("sco-ab[08-10],sco-cd") == ["sco-ab08", "sco-ab09", "sco-ab10",
                                                          "sco-cd"]  # fmt: skip
    assert c.tools.hostnames("sco-ab,sco-cd") == ["sco-ab", "sco-cd"]


# ---------------------------------------------------------------- drains and requeues


def test_a_drain_names_sco_s_deadline_and_lets_the_job_run(c: Cluster) -> None:
    busy, idle = c.node(), c.node()
    c.register(busy, FEATURES)
    job = c.submit(300.0, True)
    _running(c, job)
    _up(c, idle)
    deadline, reason = _deadline(c, 120)  # before the job's time limit ends
    c.tools.drain(busy, reason)
    c.tools.drain(idle, reason)
    b = _node_when(c, busy, lambda n: n.draining, "draining")
    assert (b.reason, b.busy, b.drained) == (reason, True, False)
    i = _node_when(c, idle, lambda n: n.drained, "drained")
    assert i.reason == reason
    running = _job(c, job)
    assert running is not None
    assert (running.state, running.nodes) == ("RUNNING", (busy,))
    views = _views(c)
    assert views[busy] == NodeView(
        joined=True, drained=False, joined_at=b.registered_at, busy=True, pinned=True,
        leaving=True, reclaim_by=deadline,
    )  # fmt: skip
    assert (views[idle].drained, views[idle].leaving, views[idle].reclaim_by) == (
        True, True, deadline,
    )  # fmt: skip
    assert _demand(c) == 1, "the job the reclaim will requeue needs a node elsewhere"


def test_a_requeued_job_is_pending_again_held_until_started_now(c: Cluster) -> None:
    """Slurm holds a requeued job back (BeginTime) for its credential's lifetime, its
    restart counted: sco counts it as demand and makes it eligible at once."""
    first = c.node()
    c.register(first, FEATURES)
    job = c.submit(300.0, True)
    _running(c, job)
    c.tools.drain(first, _deadline(c, 600)[1])
    c.tools.requeue([job])
    held = _held_after_requeue(c, job)
    assert (held.state, held.reason, held.nodes) == ("PENDING", "BeginTime", ())
    assert held.restarts >= 1
    _clear(c, first)
    _node_when(c, first, lambda n: n.drained, "drained")
    assert _demand(c) == 1, "held after a requeue, it is demand"
    second = c.node()
    _up(c, second)
    c.tools.start_now([job])
    assert _running(c, job) == {job: second}


def test_a_node_taken_down_at_its_deadline_ends_what_runs_there(c: Cluster) -> None:
    """sco's last step of a reclaim: DOWN with the drain's reason. What could be
    requeued is pending again; what could not (--no-requeue) ends."""
    a, b = c.node(), c.node()
    _up(c, a, b)
    kept, lost = c.submit(300.0, True), c.submit(300.0, False)
    on = _running(c, kept, lost)
    deadline, reason = _deadline(c, 60)
    for name in (a, b):
        c.tools.drain(name, reason)
        c.tools.down(name, reason)
    _held_after_requeue(c, kept)
    eventually(c, lambda: _job(c, lost) is None, f"job {lost} ended")
    for name in (a, b):
        _clear(c, name)
        n = _node_when(c, name, lambda n: not n.busy, "not busy")
        assert n.draining or not n.up
        assert n.reason == reason, "the node keeps sco's order"
    views = _views(c)
    for name in (a, b):
        assert (views[name].drained, views[name].leaving) == (True, True), name
        assert views[name].reclaim_by == deadline
    assert on[kept] != on[lost]


def test_a_node_whose_server_is_gone_stops_being_up_and_its_job_is_requeued(
    c: Cluster,
) -> None:
    name = c.node()
    c.register(name, FEATURES)
    job = c.submit(300.0, True)
    _running(c, job)
    c.server_gone(name)
    _node_when(c, name, lambda n: not n.up, "not up")
    assert not _views(c)[name].joined
    _held_after_requeue(c, job)
    _node_when(c, name, lambda n: not n.busy, "not busy")
    c.tools.delete_node(name)
    eventually(c, lambda: _node(c, name) is None, f"{name} deleted")


def test_a_node_with_a_job_is_not_deleted(c: Cluster) -> None:
    name = c.node()
    c.register(name, FEATURES)
    job = c.submit(300.0, True)
    _running(c, job)
    with pytest.raises(SlurmRefused):
        c.tools.delete_node(name)
    assert _node(c, name) is not None
    assert [j.job_id for j in c.tools.jobs_on(name)] == [job]


def test_acting_on_a_node_slurm_does_not_know_is_refused(c: Cluster) -> None:
    unknown = c.node()
    acts: list[Callable[[], None]] = [
        lambda: c.tools.drain(unknown, "sco: leaving by 2030-01-01T00:00:00Z"),
        lambda: c.tools.down(unknown, "sco: reclaim by 2030-01-01T00:00:00Z"),
        lambda: c.tools.delete_node(unknown),
    ]
    for act in acts:
        with pytest.raises(SlurmRefused):
            act()


def _leave_by(drain_by: float, reclaim: bool) -> Contract:
    """A contract that tells its node to leave by `drain_by`."""
    terms = Terms("hpc", "lab/hall-a/spot.small", "spot", 1, NodeState.LEAVING, drain_by, reclaim)
    return Contract("i-1", 2, terms, join="", lease_expires_at=drain_by)


def test_an_agent_drains_its_node_requeuing_only_on_a_reclaim(c: Cluster) -> None:
    """`sco agent --slurm-node`'s drain: a reclaim requeues what would not end by the
    deadline (its time limit ends later) and makes it eligible at once; sco's own move
    only waits for the job to end."""
    reclaimed = c.node()
    c.register(reclaimed, FEATURES)
    job = c.submit(30.0, True)
    _running(c, job)
    drain = SlurmDrain(_tools(c), reclaimed, 20.0, c.now, c.sleep, poll_s=0.5)
    status, detail = drain(_leave_by(c.now() + 25.0, reclaim=True))
    assert status == "drained", detail
    assert f"requeued jobs {job} (eligible at once)" in detail
    n = _node(c, reclaimed)
    assert n is not None
    assert n.draining
    again = _job(c, job)
    assert again is not None
    assert again.restarts >= 1
    # Not held back with BeginTime, which sco's demand would not count once Slurm's
    # hold were over: in the lab the replacement went as over target while it waited.
    assert not again.pending or again.reason != "BeginTime", again
    moved = c.node()
    c.register(moved, FEATURES)
    assert _running(c, job) == {job: moved}
    leaving = SlurmDrain(_tools(c), moved, 20.0, c.now, c.sleep, poll_s=0.5)
    status, detail = leaving(_leave_by(c.now() + 300.0, reclaim=False))
    assert status == "drained", detail
    assert "requeued" not in detail
    assert _job(c, job) is None, "a voluntary drain waits for the job to end"


# ---------------------------------------------------------------- slurmctld away


def test_every_call_says_unavailable_while_slurmctld_is_away(c: Cluster) -> None:
    """What a partition observing through it turns into a degraded cycle; the node
    agent's drain into a failed one (both try again). hostnames needs no slurmctld."""
    if c.away is None:
        pytest.skip("the replay's cluster has no slurmctld to lose")
    calls: dict[str, Callable[[], Any]] = {
        "partitions": c.tools.partitions,
        "nodes": c.tools.nodes,
        "jobs": lambda: c.tools.jobs([SLURM_PARTITION]),
        "jobs_on": lambda: c.tools.jobs_on("sco-nowhere"),
        "drain": lambda: c.tools.drain("sco-nowhere", "sco: leaving by 2030-01-01T00:00:00Z"),
        "down": lambda: c.tools.down("sco-nowhere", "sco: reclaim by 2030-01-01T00:00:00Z"),
        "requeue": lambda: c.tools.requeue([999999]),
        "start_now": lambda: c.tools.start_now([999999]),
        "delete_node": lambda: c.tools.delete_node("sco-nowhere"),
        "read": _view(c).read,
    }

    def outcome(call: Callable[[], Any]) -> str:
        try:
            call()
        except (SlurmUnavailable, SchedulerUnavailable) as e:
            return type(e).__name__
        except Exception as e:  # what it must not be, named
            return f"{type(e).__name__}: {e}"
        return "answered"

    with c.away(), ThreadPoolExecutor(len(calls)) as pool:  # each tries for a while
        got = dict(zip(calls, pool.map(outcome, calls.values()), strict=True))
    expected = dict.fromkeys(calls, "SlurmUnavailable") | {"read": "SchedulerUnavailable"}
    assert got == expected
    assert SLURM_PARTITION in c.tools.partitions(), "back"
