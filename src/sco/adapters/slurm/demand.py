"""Demand of a Slurm partition, from what Slurm wants.

Target nodes = the partition's nodes that are busy (or were within
`idle_keep_s`: a node does not go the moment its last job ends) + the nodes
its pending jobs need, packed first-fit decreasing into the free room of its
nodes and then into new nodes of its shape (`sco.decide.binpack`). A job's
need per node is its CPUs, memory and GRES divided over its node count.
Pending jobs that wait for something other than capacity (a dependency, a
hold, a begin time, a limit) are not counted, except a requeued job Slurm holds
back for a moment; jobs a reclaim will requeue (running on a node draining for
one, past its deadline) count as pending already; jobs no node of the shape can
ever run are reported, never counted. Jobs whose `--constraint` names
`guaranteed` count toward the units that must run on guaranteed capacity.
The target is capped by the partition's `max_units`, the floor and budget
come from the configuration, and a unit is a node.

Pending jobs of many nodes that the idle nodes cannot take are also reported one
by one (`Gang`: its nodes, time limit and declared checkpoints, `--comment
sco:checkpoint=30m`), so the planner puts each one's new nodes in one pool: a job
spread over pools is lost whole when any of them goes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sco.adapters.slurm.model import Job, SlurmNode, checkpoint_s
from sco.adapters.slurm.nodes import (
    ListedNames,
    SlurmPartition,
    SlurmView,
    cut_short,
    reclaim_deadline,
)
from sco.decide.binpack import Size, pack_runs
from sco.domain.demand import CheckpointError, Demand, Gang, Partition, within
from sco.ports import ServerView

log = logging.getLogger(__name__)

# Pending for reasons more capacity would not end.
_NOT_CAPACITY = (
    "Dependency",
    "JobHeld",
    "BeginTime",
    "Reservation",
    "QOS",
    "Assoc",
    "PartitionDown",
    "PartitionInactive",
    "PartitionTimeLimit",
    "Invalid",
    "AccountNotAllowed",
    "Licenses",
    "BadConstraints",
    "JobArrayTaskLimit",
)

GUARANTEED = "guaranteed"


@dataclass(frozen=True, slots=True)
class SlurmDemandSpec:
    partition: Partition
    slurm: SlurmPartition
    floor_units: int
    max_units: int
    guaranteed_budget_units: int
    min_target_units: int = 0  # the target never goes below this
    one_pool: bool = False  # Slurm keeps a job of many nodes in one pool (job_submit.lua)
    one_pool_max_nodes: int | None = None  # ... up to this many nodes (None: any)


@dataclass(frozen=True, slots=True)
class Need:
    """What the jobs of a partition want now, in nodes."""

    target: int
    guaranteed: int  # of which must be guaranteed capacity
    unfit_jobs: tuple[int, ...]  # pending jobs no node of the shape can run
    gangs: tuple[Gang, ...] = ()  # pending jobs of many nodes that need new nodes
    bad_checkpoints: tuple[tuple[int, str], ...] = ()  # (job, why) declarations unread
    lost_jobs: tuple[int, ...] = ()  # pending jobs Slurm will not run again (`lost_by_slurm`)


def need(
    spec: SlurmPartition,
    jobs: Sequence[Job],
    nodes: Sequence[SlurmNode],
    now: float,
    servers: Collection[str] | None = None,
    max_nodes: int | None = None,
    one_pool: bool = False,
    one_pool_max_nodes: int | None = None,
) -> Need:
    """Nodes the partition's jobs want now (pure: what was read, and now). `servers`
    names the nodes whose servers are listed: a node whose server is gone is not room
    (Slurm thinks it idle until slurmd's timeout). A job asking for more than
    `max_nodes` (the partition's most) could never run there: it is unfit. With
    `one_pool`, Slurm runs a job of many nodes (up to `one_pool_max_nodes`) only on idle
    nodes of one pool: one no pool's idle nodes hold needs new nodes, however many idle
    nodes there are."""
    mine = [
        n
        for n in nodes
        if spec.feature in n.features
        and n.up
        and not n.draining
        and (servers is None or n.name in servers)
    ]
    kept = {n.name for n in mine if n.busy or now - n.last_busy < spec.idle_keep_s}
    moving = _moving(spec, jobs, nodes)
    guaranteed_nodes = [n for n in mine if GUARANTEED in n.features]
    pending = [
        j
        for j in jobs
        if j.partition in spec.slurm_partitions
        and (_waits_for_capacity(j, now) if j.pending else j.job_id in moving)
    ]
    wants_g = [j for j in pending if j.wants(GUARANTEED)]
    others = [j for j in pending if not j.wants(GUARANTEED)]
    unfit: list[int] = []

    def slices(group: Sequence[Job]) -> list[tuple[Size, int]]:
        """Each job's nodes, as a run of its per-node size."""
        out: list[tuple[Size, int]] = []
        for j in group:
            too_many = max_nodes is not None and j.node_count > max_nodes
            if too_many or not j.per_node.fits(spec.shape):
                unfit.append(j.job_id)
                continue
            out.append((j.per_node, j.node_count))
        return out

    # Work that asks for guaranteed capacity first, on guaranteed nodes; the rest then
    # goes anywhere, in what room is left.
    room = {n.name: n.room for n in mine}
    g_pack = pack_runs(slices(wants_g), spec.shape, [room[n.name] for n in guaranteed_nodes])
    room.update(zip((n.name for n in guaranteed_nodes), g_pack.free_after, strict=True))
    whole: list[str] = []  # idle nodes that jobs of many nodes take in one pool
    pooled: tuple[Gang, ...] = ()
    if one_pool:
        wide = [j for j in others if j.node_count > 1 and j.per_node.fits(spec.shape)]
        widest = min(max_nodes or 1 << 30, one_pool_max_nodes or 1 << 30)
        wide = [j for j in wide if j.node_count <= widest]
        wide_ids = {j.job_id for j in wide}
        others = [j for j in others if j.job_id not in wide_ids]
        whole, pooled = _in_one_pool(spec, wide, [n for n in mine if n.name not in kept])
        room.update({name: Size() for name in whole})
    o_pack = pack_runs(slices(others), spec.shape, [room[n.name] for n in mine])
    # Idle nodes (past their keep) that pending work lands on are wanted again.
    g_used = {guaranteed_nodes[k].name for k in g_pack.used_free}
    used = g_used | {mine[k].name for k in o_pack.used_free} | set(whole)
    new_nodes = o_pack.new_nodes + g_pack.new_nodes + sum(g.units for g in pooled)
    target = len(kept | used) + new_nodes
    # Guaranteed nodes whose work asked for guaranteed capacity (running there, or
    # pending and landing there): only these must stay guaranteed. A guaranteed node
    # running other work is wanted as any node is, and spot may take its place.
    on_g = {name for j in jobs if not j.pending and j.wants(GUARANTEED) for name in j.nodes}
    g_kept = (kept & on_g) | g_used  # once: per node, it made a read quadratic
    g_wanted = sum(1 for n in guaranteed_nodes if n.name in g_kept)
    unfit_ids = set(unfit)
    fit = [j for j in others if j.job_id not in unfit_ids]
    taken = kept | set(whole)
    gangs, bad = _gangs(spec, fit, [n for n in mine if n.name not in taken])
    if one_pool:  # the jobs kept in one pool, and those too wide for any
        gangs, bad = pooled + gangs, _checkpoints(pending)[1]
    lost = tuple(
        j.job_id for j in jobs if j.partition in spec.slurm_partitions and lost_by_slurm(j)
    )
    return Need(target, g_wanted + g_pack.new_nodes, tuple(sorted(unfit)), gangs, bad, lost)


def lost_by_slurm(job: Job) -> bool:
    """A pending job Slurm calls BadConstraints (priority 0) that still names the nodes
    it ran on (NodeList). Slurm before 23.11.11 and 24.05.6 (SchedMD ticket 20177)
    requeues a job whose nodes all fail at once, as a reclaim of a whole pool without
    notice does, without clearing its allocation; an exclusive job of several nodes
    then never runs again, whatever nodes come (real slurmctld 22.05:
    tests/test_slurm_onepool.py), and no update, hold or release clears it. New nodes
    would only idle: sco counts none, and says so."""
    return job.pending and job.reason == "BadConstraints" and bool(job.node_list)


def _pool_of(n: SlurmNode) -> str:
    return next((f for f in sorted(n.features) if f.startswith("pool-")), "")


def _in_one_pool(
    spec: SlurmPartition, wide: Sequence[Job], idle: Sequence[SlurmNode]
) -> tuple[list[str], tuple[Gang, ...]]:
    """Jobs of many nodes as Slurm runs them when each must be in one pool: in the
    queue's order, each takes the idle nodes of the pool that holds it most tightly;
    the others need new nodes, together (gangs). Returns (idle nodes taken, gangs)."""
    free: dict[str, list[str]] = {}
    for n in idle:
        if not n.busy and spec.shape.fits(n.room):
            free.setdefault(_pool_of(n), []).append(n.name)
    taken: list[str] = []
    every, _ = _checkpoints(wide)
    gangs: list[Gang] = []
    for j in wide:
        fits = [names for names in free.values() if len(names) >= j.node_count]
        if fits:
            names = min(fits, key=len)
            taken += names[: j.node_count]
            del names[: j.node_count]
            continue
        gangs.append(Gang(j.node_count, j.limit_s, every.get(j.job_id), str(j.job_id), whole=True))
    return taken, tuple(gangs)


def _checkpoints(
    jobs: Sequence[Job],
) -> tuple[dict[int, float | None], tuple[tuple[int, str], ...]]:
    """Each job's declared checkpoint interval, and the declarations that cannot be read."""
    every: dict[int, float | None] = {}
    bad: list[tuple[int, str]] = []
    for j in jobs:
        try:
            every[j.job_id] = checkpoint_s(j.comment)
        except CheckpointError as e:
            bad.append((j.job_id, str(e)))
            every[j.job_id] = None
    return every, tuple(bad)


def _gangs(
    spec: SlurmPartition, pending: Sequence[Job], idle: Sequence[SlurmNode]
) -> tuple[tuple[Gang, ...], tuple[tuple[int, str], ...]]:
    """The pending jobs of many nodes that the idle nodes cannot take: each needs its
    nodes together (`Gang`), with its time limit and declared checkpoints. Jobs are
    taken in the queue's order, the idle nodes going to the first that fit."""
    free = sum(1 for n in idle if not n.busy and spec.shape.fits(n.room))
    every, bad = _checkpoints(pending)
    gangs: list[Gang] = []
    for j in pending:
        if j.node_count < 2:
            continue
        if j.node_count <= free:
            free -= j.node_count
            continue
        gangs.append(Gang(j.node_count, j.limit_s, every[j.job_id], str(j.job_id)))
    return tuple(gangs), bad


def _waits_for_capacity(job: Job, now: float) -> bool:
    """Pending for want of nodes. A requeued job Slurm holds back with a begin time
    (its credential's lifetime, 120 s) counts: it runs as soon as it may, and sco's
    requeue (or the agent's) makes it eligible at once."""
    return job.held_after_requeue(now) or not job.reason.startswith(_NOT_CAPACITY)


def _moving(spec: SlurmPartition, jobs: Sequence[Job], nodes: Sequence[SlurmNode]) -> set[int]:
    """Running jobs that a reclaim will requeue (their node must go before they end):
    they need a node elsewhere already, or the replacement sco created for them would
    be over the target while they still run on the node that is leaving."""
    due = {
        n.name: by
        for n in nodes
        if n.draining and spec.feature in n.features and (by := reclaim_deadline(n.reason))
    }
    return set(cut_short([j for j in jobs if not j.pending], due)[0]) if due else set()


class _SaidOnce:
    """Per partition, the jobs a warning named at the last read: a job is named when it
    first shows, and forgotten once gone (started, cancelled), so what is kept stays
    as small as the queue."""

    def __init__(self) -> None:
        self._said: dict[str, set[int]] = {}

    def fresh(self, partition: str, jobs: Iterable[int]) -> list[int]:
        """The jobs of `jobs` not named at the last read, in order."""
        now = list(dict.fromkeys(jobs))
        said = self._said.get(partition, set())
        self._said[partition] = set(now)
        return [j for j in now if j not in said]


class SlurmDemandSource:
    """`sco.ports.DemandSource` for the partitions of one Slurm cluster."""

    def __init__(
        self,
        view: SlurmView,
        specs: Sequence[SlurmDemandSpec],
        listing: Callable[[str], Sequence[ServerView]] | None = None,
    ) -> None:
        """`listing` is the provider's last listing of a partition's servers."""
        self.view = view
        self._listing = listing
        self.specs: Mapping[str, SlurmDemandSpec] = {s.partition.name: s for s in specs}
        self._unfit = _SaidOnce()  # jobs no node of the shape runs
        self._refused = _SaidOnce()  # jobs whose checkpoint declaration was refused
        self._lost = _SaidOnce()  # jobs Slurm lost (`lost_by_slurm`)
        # partition -> (jobs, nodes, now, servers, need) of its last count: asked again
        # on the same read (the same lists) at the same time, the count is the same
        self._last: dict[str, tuple[object, object, float, object, Need]] = {}
        self._names = ListedNames()

    def partitions(self) -> Sequence[Partition]:
        return [s.partition for s in self.specs.values()]

    def demand(self, partition: str, now: float) -> Demand:
        """Raises SchedulerUnavailable when Slurm cannot be read."""
        spec = self.specs[partition]
        jobs, nodes = self.view.read()
        servers = None
        if self._listing is not None:
            servers = self._names.of(partition, self._listing(partition)).keys()
        n = self._need(partition, spec, jobs, nodes, now, servers)
        fresh = self._unfit.fresh(partition, n.unfit_jobs)
        if fresh:
            log.warning(
                "partition %s: jobs %s ask more of a node than its shape has "
                "(%g CPUs, %g MB) or more nodes than its most (%d): not counted",
                partition,
                fresh,
                spec.slurm.shape.cpus,
                spec.slurm.shape.memory_mb,
                spec.max_units,
            )
        why_refused = dict(n.bad_checkpoints)
        for job in self._refused.fresh(partition, why_refused):
            log.warning(
                "partition %s: job %d's checkpoint declaration is refused: %s; "
                "it is placed as a job that does not checkpoint",
                partition, job, why_refused[job],
            )  # fmt: skip
        fresh = self._lost.fresh(partition, n.lost_jobs)
        if fresh:
            log.warning(
                "partition %s: jobs %s are pending as BadConstraints on the nodes they ran "
                "on: Slurm requeued them when all their nodes failed at once and kept the "
                "old allocation (a Slurm bug, fixed in 23.11.11 and 24.05.6); they will not "
                "run again, so no node is created for them: resubmit them, or upgrade Slurm",
                partition, fresh,
            )  # fmt: skip
        target = min(spec.max_units, max(spec.min_target_units, n.target))
        return Demand(
            target_units=target,
            floor_units=min(spec.floor_units, spec.max_units),
            max_units=spec.max_units,
            guaranteed_budget_units=spec.guaranteed_budget_units,
            guaranteed_units=min(n.guaranteed, target, spec.guaranteed_budget_units),
            unfit_work=len(n.unfit_jobs) + len(n.lost_jobs),
            gangs=within(n.gangs, n.target, target),
        )

    def _need(
        self,
        partition: str,
        spec: SlurmDemandSpec,
        jobs: Sequence[Job],
        nodes: Sequence[SlurmNode],
        now: float,
        servers: Collection[str] | None,
    ) -> Need:
        last = self._last.get(partition)
        same_read = last is not None and last[0] is jobs and last[1] is nodes
        if last is not None and same_read and last[2:4] == (now, servers):
            return last[4]
        n = need(
            spec.slurm, jobs, nodes, now, servers, max_nodes=spec.max_units,
            one_pool=spec.one_pool, one_pool_max_nodes=spec.one_pool_max_nodes,
        )  # fmt: skip
        self._last[partition] = (jobs, nodes, now, servers, n)
        return n

    def next_change_after(self, now: float) -> float | None:  # noqa: ARG002
        """Unknown: Slurm's demand changes as jobs come."""
        return None
