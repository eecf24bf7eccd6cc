"""A simulated Slurm cluster that answers as `SlurmTools` does, for the swarm.

sco's real Slurm code (`SlurmNodes`, `SlurmDemandSource`) reads it and acts on
it exactly as on slurmctld: jobs queue, run on sco's dynamic nodes, and are
drained, requeued, taken DOWN or lost with their node. What the swarm's
invariants need is kept as it happens: which work a reclaim cut short, and
when each node was told it must leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sco.adapters.slurm.model import Job, SlurmNode
from sco.adapters.slurm.tools import SlurmRefused, SlurmUnavailable
from sco.decide.binpack import Size

CRED_EXPIRE_S = 120.0  # AuthInfo cred_expire: how long slurmctld holds a requeued job


@dataclass
class SimJob:
    job_id: int
    partition: str  # the Slurm partition
    run_s: float  # work it needs
    requeue: bool
    submitted_at: float
    state: str = "PENDING"  # PENDING, RUNNING, COMPLETED, FAILED
    node: str | None = None
    started_at: float | None = None
    done_s: float = 0.0  # work done in earlier runs (none: no checkpoints)
    requeues: int = 0
    eligible_at: float = 0.0  # a requeued job waits (BeginTime) for the credential to expire


@dataclass
class SimNode:
    name: str
    features: frozenset[str]
    registered_at: float
    state: str = "idle"  # idle, allocated, down
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    last_busy: float = 0.0
    told: list[tuple[float, str]] = field(default_factory=list)  # (at, reason) of drains


@dataclass(frozen=True, slots=True)
class CutShort:
    """Work a node's end took with it: `saved` when it had been requeued in time."""

    job_id: int
    node: str
    at: float
    requeueable: bool


class SimSlurm:
    """slurmctld and its nodes on the swarm's clock. `available` false: the tools
    cannot reach it (SlurmUnavailable), as a restarting slurmctld."""

    def __init__(
        self, name: str, cpus: int, memory_mb: int, now: Callable[[], float], feature: str
    ) -> None:
        self.name = name
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.now = now
        self.feature = feature  # the one sco partition it serves (its feature)
        self.available = True
        self.jobs_by_id: dict[int, SimJob] = {}
        self.nodes_by_name: dict[str, SimNode] = {}
        self.cut: list[CutShort] = []  # running work lost with its node
        self.requeued: list[tuple[int, str, float]] = []  # (job, node, at) by sco's order
        self.calls = 0  # tool calls that change something: a dry run must make none
        self._next_id = 1

    # ------------------------------------------------------------ SlurmTools

    def _reach(self) -> None:
        if not self.available:
            raise SlurmUnavailable(f"{self.name}: Unable to contact slurm controller")

    def jobs(self, partitions: Sequence[str]) -> list[Job]:
        self._reach()
        shape = Size(self.cpus, self.memory_mb)
        out = []
        for j in self.jobs_by_id.values():
            if j.state not in ("PENDING", "RUNNING") or j.partition not in partitions:
                continue
            end = None
            if j.started_at is not None:
                end = j.started_at + 1.5 * (j.run_s - j.done_s) + 60.0  # its time limit
            out.append(
                Job(
                    job_id=j.job_id,
                    state=j.state,
                    reason=self._why_pending(j),
                    partition=j.partition,
                    node_count=1,
                    per_node=shape,
                    features="",
                    requeue=j.requeue,
                    end_time=end,
                    nodes=(j.node,) if j.node else (),
                )
            )
        return out

    def nodes(self) -> list[SlurmNode]:
        self._reach()
        return [self._view(n) for n in self.nodes_by_name.values()]

    def _view(self, n: SimNode) -> SlurmNode:
        busy = n.state == "allocated"
        return SlurmNode(
            name=n.name,
            state=n.state,
            flags=frozenset(n.flags),
            features=n.features,
            reason=n.reason,
            cpus=self.cpus,
            alloc_cpus=self.cpus if busy else 0,
            memory_mb=self.memory_mb,
            alloc_memory_mb=self.memory_mb if busy else 0,
            partitions=("batch",),
            last_busy=n.last_busy,
            registered_at=n.registered_at,
        )

    def drain(self, node: str, reason: str) -> None:
        self._reach()
        n = self.nodes_by_name.get(node)
        if n is None:
            raise SlurmRefused(f"{self.name}: scontrol: Invalid node name specified")
        self.calls += 1
        n.flags.add("DRAIN")
        n.reason = reason
        n.told.append((self.now(), reason))

    def down(self, node: str, reason: str) -> None:
        self._reach()
        n = self.nodes_by_name.get(node)
        if n is None:
            raise SlurmRefused(f"{self.name}: scontrol: Invalid node name specified")
        self.calls += 1
        self._lose_work(n, lost=True)
        n.state, n.reason = "down", reason

    def requeue(self, job_ids: Sequence[int]) -> None:
        self._reach()
        self.calls += 1
        for i in job_ids:
            j = self.jobs_by_id.get(i)
            if j is None or j.state != "RUNNING" or j.node is None:
                continue
            self.requeued.append((i, j.node, self.now()))
            self._back_to_queue(j)

    def start_now(self, job_ids: Sequence[int]) -> None:
        self._reach()
        for i in job_ids:
            j = self.jobs_by_id.get(i)
            if j is not None and j.state == "PENDING":
                j.eligible_at = self.now()

    def delete_node(self, node: str) -> None:
        self._reach()
        n = self.nodes_by_name.get(node)
        if n is None:
            return
        if n.state == "allocated":
            raise SlurmRefused(f"{self.name}: scontrol: node {node} has jobs")
        self.calls += 1
        del self.nodes_by_name[node]

    def _why_pending(self, j: SimJob) -> str:
        if j.state != "PENDING":
            return "None"
        return "BeginTime" if j.eligible_at > self.now() else "Resources"

    # ------------------------------------------------------------ the world's side

    def submit(self, run_s: float, requeue: bool) -> None:
        j = SimJob(self._next_id, "batch", run_s, requeue, self.now())
        self.jobs_by_id[j.job_id] = j
        self._next_id += 1

    def register(self, name: str, features: frozenset[str]) -> None:
        """A server booted and its slurmd registered itself (a dynamic node)."""
        if name not in self.nodes_by_name:
            self.nodes_by_name[name] = SimNode(name, features, self.now(), last_busy=self.now())

    def server_gone(self, name: str) -> None:
        """The node's server is gone: slurmd with it. Running work is lost (Slurm requeues
        what may be, as NODE_FAIL does), and the node stops responding."""
        n = self.nodes_by_name.get(name)
        if n is None:
            return
        self._lose_work(n, lost=True)
        n.state = "down"
        n.flags.add("NOT_RESPONDING")

    def forget(self, name: str) -> None:
        """slurmctld came back on state saved before this node registered."""
        n = self.nodes_by_name.pop(name, None)
        if n is not None:
            self._lose_work(n, lost=True)

    def step(self) -> None:
        """Jobs that finished end; pending jobs start on free nodes, first come first."""
        now = self.now()
        for j in self.jobs_by_id.values():
            started = j.started_at
            if j.state == "RUNNING" and started is not None and now - started >= j.run_s:
                self._finish(j)
        free = [
            n
            for n in self.nodes_by_name.values()
            if n.state == "idle" and not n.flags and self.feature in n.features
        ]
        if not free:
            return
        for j in self.jobs_by_id.values():
            if not free:
                break
            if j.state == "PENDING" and j.eligible_at <= now:
                n = free.pop(0)
                j.state, j.node, j.started_at = "RUNNING", n.name, now
                n.state = "allocated"

    def _finish(self, j: SimJob) -> None:
        j.state = "COMPLETED"
        n = self.nodes_by_name.get(j.node or "")
        if n is not None and n.state == "allocated":
            n.state, n.last_busy = "idle", self.now()
        j.node = None

    def _back_to_queue(self, j: SimJob) -> None:
        n = self.nodes_by_name.get(j.node or "")
        if n is not None and n.state == "allocated":
            n.state, n.last_busy = "idle", self.now()
        j.state, j.node, j.started_at = "PENDING", None, None
        j.requeues += 1
        j.eligible_at = self.now() + CRED_EXPIRE_S

    def _lose_work(self, n: SimNode, lost: bool) -> None:
        for j in self.jobs_by_id.values():
            if j.state == "RUNNING" and j.node == n.name:
                if lost:
                    self.cut.append(CutShort(j.job_id, n.name, self.now(), j.requeue))
                if j.requeue:
                    self._back_to_queue(j)
                else:
                    j.state, j.node = "FAILED", None
        if n.state == "allocated":
            n.state = "idle"

    # ------------------------------------------------------------ for the invariants

    def running_on(self, name: str) -> list[SimJob]:
        """Jobs running on `name` now (one whose work ended since the last step is done,
        not running: the world steps in ticks)."""
        now = self.now()
        return [
            j
            for j in self.jobs_by_id.values()
            if j.state == "RUNNING"
            and j.node == name
            and not (j.started_at is not None and now - j.started_at >= j.run_s)
        ]

    def told_reclaim_by(self, name: str) -> float | None:
        """When the node was first told to leave for a reclaim, if it was."""
        n = self.nodes_by_name.get(name)
        if n is None:
            return None
        return next((at for at, why in n.told if why.startswith("sco: reclaim")), None)

    def out_by_sco(self, name: str) -> bool:
        """Whether sco told the node to leave (DRAIN, or DOWN with sco's reason)."""
        n = self.nodes_by_name.get(name)
        return (
            n is not None
            and n.reason.startswith("sco:")
            and ("DRAIN" in n.flags or n.state == "down")
        )

    def fingerprint(self) -> tuple[object, ...]:
        """What a dry run must leave as it was."""
        return (
            self.calls,
            tuple(
                (n.name, n.state, tuple(sorted(n.flags)), n.reason)
                for n in self.nodes_by_name.values()
            ),
            tuple((j.job_id, j.state, j.node) for j in self.jobs_by_id.values()),
        )
