"""A Slurm cluster on the lab's clock, for replaying a batch workload: jobs of many
nodes queue first come, first served with EASY backfill, run on sco's dynamic
nodes, and are drained, requeued or cut short with their nodes.

It answers every call sco makes of `SlurmTools` as a real slurmctld does
(partitions, nodes, jobs, jobs on a node, hostnames; drain, down, requeue, start
now, delete a node: tests/conformance/test_schedulers.py holds both to the same
rules), so sco's own Slurm code (`SlurmView`, `SlurmDemandSource`, `SlurmNodes`,
the agent's `SlurmDrain`) turns its queue into demand and acts on it.

What a job's user feels is kept as it happens: its waits (from a requeue to its next
start apart too), its requeues, the work lost with a node. Two ways of leaving differ:
- sco requeues a job before its node's deadline (it had the notice): the job is
  told as `--signal` tells it, saves its state, and resumes later where it
  stopped: nothing is lost;
- the node goes with the job on it (no notice, a notice too short, or a node
  taken DOWN at its deadline): the work since the job's start, or since its
  last checkpoint when the workload checkpoints every `checkpoint_s`, is lost,
  and the job is requeued (Slurm's NODE_FAIL requeue).
Either way a requeued job waits `requeue_hold_s` (Slurm's credential lifetime)
unless told to start now, and keeps its place (its age) in the queue.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sco.adapters.slurm.model import CHECKPOINT_KEY, Job, SlurmNode
from sco.adapters.slurm.tools import SlurmRefused
from sco.decide.binpack import Size
from sco.lab.workload.hostlist import HOSTLIST_PARTS, expand
from sco.lab.workload.swf import BatchJob
from sco.lab.workload.topology import first_pool, pick, room_for, where

REQUEUE_HOLD_S = 120.0  # AuthInfo cred_expire: how long slurmctld holds a requeued job


@dataclass
class QueuedJob:
    job: BatchJob
    requeue: bool = True
    state: str = "PENDING"  # PENDING, RUNNING, COMPLETED, FAILED
    nodes: tuple[str, ...] = ()
    started_at: float | None = None
    done_s: float = 0.0  # work kept from earlier runs (saved on a signal, or checkpoints)
    eligible_at: float = 0.0
    pending_since: float = 0.0
    waited_s: float = 0.0  # time pending so far, over all its waits
    requeues: int = 0
    lost_node_s: float = 0.0
    pools_spanned: int = 0  # the most pools one of its runs spanned
    reclaims_met: int = 0  # runs ended by a reclaim (requeued on notice, or cut)
    ended_at: float | None = None
    view: tuple[tuple[object, ...], Job] | None = None  # as last read, and what it read from

    @property
    def left_s(self) -> float:
        return self.job.run_s - self.done_s

    def ends_at(self) -> float:
        """When its current run ends by its work (it is running)."""
        assert self.started_at is not None
        return self.started_at + self.left_s

    @property
    def limit_left_s(self) -> float:
        """How long a run of it may take from now on by its time limit."""
        return max(self.job.limit_s - self.done_s, self.left_s)

    def limit_at(self) -> float:
        """When its current run ends by its time limit: what backfill plans with."""
        assert self.started_at is not None
        return self.started_at + self.limit_left_s


@dataclass
class ClusterNode:
    name: str
    features: frozenset[str]
    registered_at: float
    state: str = "idle"  # idle, allocated, down
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    last_busy: float = 0.0
    job: int | None = None
    view: SlurmNode | None = None  # as last read; None once anything changed
    gone_at: float | None = None  # when its server went
    seq: int = 0  # registration order: free nodes are taken in it
    where: tuple[str, str] = ("", "")  # (hall, pool): its switches in the topology


class BatchCluster:
    """slurmctld and its nodes. Nodes are whole (one job each), of one shape."""

    def __init__(
        self,
        name: str,
        shape: Size,
        now: Callable[[], float],
        feature: str,
        slurm_partition: str = "batch",
        checkpoint_s: float | None = None,
        requeue_hold_s: float = REQUEUE_HOLD_S,
        topology: Mapping[str, str] | None = None,
    ) -> None:
        if checkpoint_s is not None and checkpoint_s <= 0:
            raise ValueError(f"checkpoint_s must be > 0, got {checkpoint_s}")
        self.name = name
        self.shape = shape
        self.now = now
        self.feature = feature
        self.slurm_partition = slurm_partition
        self.checkpoint_s = checkpoint_s
        self.requeue_hold_s = requeue_hold_s
        # Jobs that checkpoint say so, as a user declares it (`sco:checkpoint=`).
        self._comment = "" if checkpoint_s is None else f"{CHECKPOINT_KEY}{checkpoint_s:g}s"
        # A switch per pool (its node feature) under one per hall: topology/tree. None:
        # flat, a job takes the free nodes that came first.
        self.topology = topology
        # Jobs of many nodes constrained to one pool (`[pool-a|pool-b|..]`, as sco's
        # job_submit.lua adds it): the first pool in this order that holds the job.
        self.pool_order: Sequence[str] | None = None
        self.pool_widest: int | None = None  # ... jobs of at most this many nodes
        self.jobs_by_id: dict[int, QueuedJob] = {}  # every job submitted
        self.live: dict[int, QueuedJob] = {}  # pending and running
        self.nodes_by_name: dict[str, ClusterNode] = {}
        self.lost: list[tuple[float, float]] = []  # (when, node-seconds) of each lost run
        self.busy_node_s = 0.0  # node-seconds of runs ended (completed, requeued or cut)
        self.restart_waits: list[float] = []  # from each requeue to its job's next start
        self._up_node_s = 0.0  # node-seconds up of nodes deleted
        # Reads are many (demand, nodes, deadlines: each cycle) and changes few: what
        # was read is kept until something changes (`_changed`).
        self._version = 0
        self._jobs_read: tuple[tuple[int, float], list[Job]] = ((-1, 0.0), [])
        self._nodes_read: tuple[int, list[SlurmNode]] = (-1, [])
        # (version, first end of a running job, held jobs' start times, in order)
        self._events: tuple[int, float, list[float]] = (-1, math.inf, [])
        self._limits: dict[int, tuple[float, int]] = {}  # running: (end by limit, nodes)
        self._ends: dict[int, float] = {}  # running: end by its work
        self._free_nodes: dict[str, ClusterNode] = {}  # idle, not drained, the partition's
        self._registered = 0  # nodes that ever registered
        self._scheduled = -1  # the version the queue was last scheduled at
        self._wake_at = math.inf  # and when a job held then may start

    # ------------------------------------------------------------ SlurmTools

    def _reach(self) -> None:
        """slurmctld answers (the swarm's may be away: `SimSlurm`)."""

    def partitions(self) -> set[str]:
        self._reach()
        return {self.slurm_partition}

    def jobs_on(self, node: str) -> list[Job]:
        """Jobs allocated on `node`."""
        self._reach()
        return [j for j in self.jobs([self.slurm_partition]) if node in j.nodes]

    def hostnames(self, hostlist: str) -> list[str]:
        """Names in a hostlist (`sco-a[1-3],sco-b`), as scontrol expands it by itself."""
        return [name for part in HOSTLIST_PARTS.findall(hostlist) for name in expand(part)]

    def jobs(self, partitions: Sequence[str]) -> list[Job]:
        if self.slurm_partition not in partitions:
            return []
        key = (self._version, self.now())
        if self._jobs_read[0] != key:
            self._jobs_read = (key, [self._view_job(q) for q in self.live.values()])
        return self._jobs_read[1]  # the same list until something changes: never mutated

    def _view_job(self, q: QueuedJob) -> Job:
        pending = q.state == "PENDING"
        reason = "None"
        if pending:
            reason = "BeginTime" if q.eligible_at > self.now() else "Resources"
        key = (q.state, reason, q.eligible_at, q.started_at, q.done_s, q.nodes, q.requeues)
        if q.view is None or q.view[0] != key:  # read as before: the same Job
            q.view = (key, self._job_as_read(q, reason))
        return q.view[1]

    def _job_as_read(self, q: QueuedJob, reason: str) -> Job:
        pending = q.state == "PENDING"
        return Job(
            job_id=q.job.job_id,
            state=q.state,
            reason=reason,
            partition=self.slurm_partition,
            node_count=q.job.nodes,
            per_node=self.shape,
            features="",
            requeue=q.requeue,
            end_time=None if pending else q.limit_at(),
            nodes=q.nodes,
            restarts=q.requeues,
            begin_time=q.eligible_at if reason == "BeginTime" else 0.0,
            limit_s=q.job.limit_s,
            comment=self._comment,
        )

    def nodes(self) -> list[SlurmNode]:
        if self._nodes_read[0] != self._version:
            self._nodes_read = (
                self._version,
                [n.view or self._view_node(n) for n in self.nodes_by_name.values()],
            )
        return self._nodes_read[1]

    def _view_node(self, n: ClusterNode) -> SlurmNode:
        n.view = n.view or self._node_as_read(n)
        return n.view

    def _changed(self, *nodes: ClusterNode) -> None:
        """Something changed (on `nodes`, if any: every change to a node names it)."""
        self._version += 1
        for n in nodes:
            n.view = None
            if _free(n, self.feature) and self.nodes_by_name.get(n.name) is n:
                self._free_nodes[n.name] = n
            else:
                self._free_nodes.pop(n.name, None)

    def _node_as_read(self, n: ClusterNode) -> SlurmNode:
        busy = n.state == "allocated"
        return SlurmNode(
            name=n.name,
            state=n.state,
            flags=frozenset(n.flags),
            features=n.features,
            reason=n.reason,
            cpus=int(self.shape.cpus),
            alloc_cpus=int(self.shape.cpus) if busy else 0,
            memory_mb=int(self.shape.memory_mb),
            alloc_memory_mb=int(self.shape.memory_mb) if busy else 0,
            partitions=(self.slurm_partition,),
            last_busy=n.last_busy,
            registered_at=n.registered_at,
        )

    def drain(self, node: str, reason: str) -> None:
        n = self._node(node)
        n.flags.add("DRAIN")
        n.reason = reason
        self._changed(n)

    def down(self, node: str, reason: str) -> None:
        n = self._node(node)
        self._cut(n)
        n.state, n.reason = "down", reason
        self._changed(n)

    def requeue(self, job_ids: Sequence[int]) -> None:
        """Told in time: each job saves its state and goes back to the queue."""
        now = self.now()
        for i in job_ids:
            q = self.jobs_by_id.get(i)
            if q is None or q.state != "RUNNING" or q.started_at is None:
                continue
            q.done_s += now - q.started_at
            q.reclaims_met += 1
            self._back_to_queue(q, now)

    def start_now(self, job_ids: Sequence[int]) -> None:
        for i in job_ids:
            q = self.jobs_by_id.get(i)
            if q is not None and q.state == "PENDING":
                q.eligible_at = self.now()
                self._changed()

    def delete_node(self, node: str) -> None:
        n = self.nodes_by_name.get(node)
        if n is None or n.state == "allocated":  # scontrol names neither reason
            raise SlurmRefused(f"{self.name}: scontrol: failed to delete nodes {node}")
        self._up_node_s += (n.gone_at or self.now()) - n.registered_at
        del self.nodes_by_name[node]
        self._changed(n)

    def _node(self, name: str) -> ClusterNode:
        n = self.nodes_by_name.get(name)
        if n is None:
            raise SlurmRefused(f"{self.name}: scontrol: Invalid node name specified")
        return n

    # ------------------------------------------------------------ the world's side

    def submit(self, job: BatchJob, requeue: bool = True) -> None:
        now = self.now()
        q = QueuedJob(job, requeue, eligible_at=now, pending_since=now)
        self.jobs_by_id[job.job_id] = self.live[job.job_id] = q
        self._changed()

    def register(self, name: str, features: frozenset[str]) -> None:
        """A server booted and its slurmd registered itself (a dynamic node)."""
        if name not in self.nodes_by_name:
            now = self.now()
            self._registered += 1
            n = ClusterNode(name, features, now, last_busy=now, seq=self._registered)
            n.where = where(features, self.topology)
            self.nodes_by_name[name] = n
            self._changed(n)

    def server_gone(self, name: str) -> None:
        """The node's server is gone, slurmd with it: its job's run is cut short."""
        n = self.nodes_by_name.get(name)
        if n is None:
            return
        self._cut(n)
        n.state = "down"
        n.flags.add("NOT_RESPONDING")
        if n.gone_at is None:
            n.gone_at = self.now()
        self._changed(n)

    def next_event_time(self) -> float | None:
        """When a running job ends or a held one may start."""
        _, end, held = self._next_events()
        now = self.now()
        wake = held[bisect.bisect_right(held, now)] if held and held[-1] > now else math.inf
        first = min(end, wake)
        return None if first == math.inf else first

    def step(self) -> bool:
        """Jobs whose work is done end; the queue is scheduled. True: one ended or started."""
        now = self.now()
        done = []
        if self._next_events()[1] <= now:  # else no run has ended: no need to look
            done = [q for q in self.live.values() if q.state == "RUNNING" and q.ends_at() <= now]
        for q in done:
            self._finish(q)
        return self._schedule(now) or bool(done)

    def _next_events(self) -> tuple[int, float, list[float]]:
        """(version, first end of a running job, held jobs' start times, sorted): once a change."""
        if self._events[0] != self._version:
            held = sorted(q.eligible_at for q in self.live.values() if q.state == "PENDING")
            self._events = (self._version, min(self._ends.values(), default=math.inf), held)
        return self._events

    def utilisation(self, end: float) -> float | None:
        """Node-seconds running jobs over node-seconds of nodes up (registered until
        their server went), by `end`: how much of the capacity paid for did work."""
        up = self._up_node_s + sum(
            (n.gone_at or end) - n.registered_at for n in self.nodes_by_name.values()
        )
        busy = self.busy_node_s + sum(
            (end - q.started_at) * len(q.nodes)
            for q in self.live.values()
            if q.state == "RUNNING" and q.started_at is not None
        )
        return busy / up if up > 0 else None

    # ------------------------------------------------------------ scheduling

    def _schedule(self, now: float) -> bool:
        """First come, first served with EASY backfill: the first job that cannot
        start gets a reservation at the earliest time enough nodes free up (by the
        running jobs' time limits); a later job starts now only if it fits the free
        nodes and ends (by its limit) before that, or leaves the reservation enough.
        A first job wider than every node the cluster has gets no reservation: the
        nodes it waits for are still to come."""
        if self._scheduled == self._version and now < self._wake_at:
            return False  # nothing changed, and no held job may start yet
        started = self._start_what_can(now)
        self._scheduled = self._version
        self._wake_at = min(
            (q.eligible_at for q in self.live.values() if q.eligible_at > now), default=math.inf
        )
        return started

    def _start_what_can(self, now: float) -> bool:
        free = sorted(self._free_nodes.values(), key=_by_seq)  # in the order they came
        if not free:
            return False
        queue = sorted(
            (q for q in self.live.values() if q.state == "PENDING" and q.eligible_at <= now),
            key=lambda q: (q.job.submit_s, q.job.job_id),
        )
        shadow, extra = math.inf, math.inf
        blocked = started = False
        for q in queue:
            if not free:
                break
            n = q.job.nodes
            if not blocked:
                if self._room_for(n, free):
                    self._start(q, free, now)
                    started = True
                    continue
                blocked = True
                shadow, extra = self._reservation(n, len(free))
                continue
            if not self._room_for(n, free):
                continue
            if now + q.limit_left_s <= shadow:
                self._start(q, free, now)
                started = True
            elif n <= extra:
                extra -= n
                self._start(q, free, now)
                started = True
        return started

    def _room_for(self, want: int, free: list[ClusterNode]) -> bool:
        """Whether a job of `want` nodes may start on `free` now (`room_for`)."""
        return room_for(free, want, one_pool=self._one_pool(want))

    def _one_pool(self, want: int) -> bool:
        return self.pool_order is not None and want <= (self.pool_widest or want)

    def _reservation(self, want: int, free: int) -> tuple[float, float]:
        """(when, nodes to spare then) for a job of `want` nodes, by running jobs' limits."""
        have = free
        for at, count in sorted(self._limits.values()):
            have += count
            if have >= want:
                return at, have - want
        return math.inf, math.inf

    def _start(self, q: QueuedJob, free: list[ClusterNode], now: float) -> None:
        want = q.job.nodes
        if self.pool_order is not None and self._one_pool(want):
            taken = first_pool(free, want, self.pool_order)
        elif self.topology is not None:
            taken = pick(free, want)
        else:
            taken = free[:want]
        chosen = {id(n) for n in taken}
        free[:] = [n for n in free if id(n) not in chosen]
        for n in taken:
            n.state, n.job = "allocated", q.job.job_id
        self._changed(*taken)
        q.state, q.nodes, q.started_at = "RUNNING", tuple(n.name for n in taken), now
        self._limits[q.job.job_id] = (q.limit_at(), len(taken))
        self._ends[q.job.job_id] = q.ends_at()
        q.pools_spanned = max(q.pools_spanned, len({n.where[1] for n in taken}))
        q.waited_s += now - q.pending_since
        if q.requeues:
            self.restart_waits.append(now - q.pending_since)

    def _finish(self, q: QueuedJob) -> None:
        end = q.ends_at()
        q.done_s, q.state, q.ended_at = q.job.run_s, "COMPLETED", end
        self._release(q, end)
        del self.live[q.job.job_id]

    def _release(self, q: QueuedJob, at: float) -> None:
        self._limits.pop(q.job.job_id, None)
        self._ends.pop(q.job.job_id, None)
        if q.started_at is not None:
            self.busy_node_s += (at - q.started_at) * len(q.nodes)
        for name in q.nodes:
            n = self.nodes_by_name.get(name)
            if n is not None and n.job == q.job.job_id:
                n.job = None
                if n.state == "allocated":
                    n.state = "idle"
                n.last_busy = at
                self._changed(n)
        q.nodes, q.started_at = (), None

    def _back_to_queue(self, q: QueuedJob, now: float) -> None:
        assert q.started_at is not None
        self._release(q, now)
        q.state, q.pending_since = "PENDING", now
        q.requeues += 1
        q.eligible_at = now + self.requeue_hold_s
        self._changed()  # the job reads otherwise now, whatever its nodes

    def _cut(self, n: ClusterNode) -> None:
        """The run on `n` ends without a word: the work since its last checkpoint is lost."""
        q = self.jobs_by_id.get(n.job) if n.job is not None else None
        if q is None or q.state != "RUNNING" or q.started_at is None:
            return
        now = self.now()
        ran = now - q.started_at
        q.reclaims_met += 1
        kept = 0.0
        if self.checkpoint_s is not None:
            kept = math.floor(ran / self.checkpoint_s) * self.checkpoint_s
        q.lost_node_s += (ran - kept) * len(q.nodes)
        if ran > kept:
            self.lost.append((now, (ran - kept) * len(q.nodes)))
        q.done_s += kept
        if q.requeue:
            self._back_to_queue(q, now)
        else:
            self._release(q, now)
            q.state, q.ended_at = "FAILED", now
            del self.live[q.job.job_id]


def _free(n: ClusterNode, feature: str) -> bool:
    return n.state == "idle" and not n.flags and feature in n.features


def _by_seq(n: ClusterNode) -> int:
    return n.seq
