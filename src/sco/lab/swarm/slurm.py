"""The lab's Slurm cluster (`sco.lab.workload.cluster`) as the swarm runs it: one-node
jobs the adversary submits, a slurmctld that may be away (`available`), every tool
call that changes something counted (a dry run must make none), and what the
swarm's invariants read: when each node was first told it must leave, and whether
sco told it.

sco's real Slurm code (`SlurmNodes`, `SlurmDemandSource`) reads it and acts on
it exactly as on slurmctld.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sco.adapters.slurm.model import Job, SlurmNode
from sco.adapters.slurm.tools import SlurmUnavailable
from sco.decide.binpack import Size
from sco.lab.swarm.promises import Breaches
from sco.lab.workload.cluster import BatchCluster, QueuedJob
from sco.lab.workload.swf import BatchJob

DEFERRED_S = 3600.0  # how far a user defers a requeued job
REQUEUE_HOLD_MAX_S = 300.0  # the longest begin time that is Slurm's own hold (docs/slurm.md)


class SimSlurm(BatchCluster):
    """slurmctld and its nodes on the swarm's clock. `available` false: the tools
    cannot reach it (SlurmUnavailable), as a restarting slurmctld."""

    def __init__(
        self, name: str, cpus: int, memory_mb: int, now: Callable[[], float], feature: str
    ) -> None:
        super().__init__(name, Size(cpus, memory_mb), now, feature)
        self.available = True
        self.calls = 0  # tool calls that change something: a dry run must make none
        self.told: dict[str, list[tuple[float, str]]] = {}  # node -> (at, reason) of drains
        self.breaches = Breaches()  # what sco did against a promise
        self.refused = 0  # calls refused while it was away (a fault's effect)
        self._next_id = 1

    def _reach(self) -> None:
        if not self.available:
            self.refused += 1
            raise SlurmUnavailable(f"{self.name}: Unable to contact slurm controller")

    # ------------------------------------------------------------ SlurmTools

    def jobs(self, partitions: Sequence[str]) -> list[Job]:
        self._reach()
        return super().jobs(partitions)

    def nodes(self) -> list[SlurmNode]:
        self._reach()
        return super().nodes()

    def drain(self, node: str, reason: str) -> None:
        self._reach()
        super().drain(node, reason)
        self.calls += 1
        self.told.setdefault(node, []).append((self.now(), reason))

    def down(self, node: str, reason: str) -> None:
        self._reach()
        super().down(node, reason)
        self.calls += 1

    def requeue(self, job_ids: Sequence[int]) -> None:
        self._reach()
        self.calls += 1
        for q in [self.live[i] for i in job_ids if i in self.live]:
            whys = {n: self.nodes_by_name[n].reason for n in q.nodes if n in self.nodes_by_name}
            own = {n: why for n, why in whys.items() if "reclaim" not in why}
            self.breaches.look("own_moves_only_drain", bool(own),
                               f"job {q.job.job_id} requeued off {own}")  # fmt: skip
        super().requeue(job_ids)
        # Its user defers one requeued job in five by an hour (`scontrol update
        # StartTime=`): sco must leave it to wait.
        for held in [self.live[i] for i in job_ids if i in self.live and i % 5 == 0]:
            if held.state == "PENDING":
                held.eligible_at = self.now() + DEFERRED_S

    def start_now(self, job_ids: Sequence[int]) -> None:
        self._reach()
        for i in job_ids:
            wait = self.live[i].eligible_at if i in self.live else 0.0
            deferred = wait > self.now() + REQUEUE_HOLD_MAX_S
            self.breaches.look("deferral_kept", deferred, f"job {i}, deferred, started now")
        super().start_now(job_ids)

    def delete_node(self, node: str) -> None:
        self._reach()
        known = node in self.nodes_by_name
        super().delete_node(node)
        if known:
            self.calls += 1
            self.told.pop(node, None)  # a node of that name registering again is new

    # ------------------------------------------------------------ the world's side

    def submit_run(self, run_s: float, requeue: bool) -> None:
        """A one-node job needing `run_s`, its time limit half as long again and a
        minute (as users overestimate)."""
        job = BatchJob(self._next_id, self.now(), 1, run_s, 1.5 * run_s + 60.0)
        self._next_id += 1
        self.submit(job, requeue)

    def forget(self, name: str) -> None:
        """slurmctld came back on state saved before this node registered."""
        n = self.nodes_by_name.get(name)
        if n is not None:
            self._cut(n)
            del self.nodes_by_name[name]
            self.told.pop(name, None)
            self._changed(n)

    # ------------------------------------------------------------ for the invariants

    def running_on(self, name: str) -> list[QueuedJob]:
        """Jobs running on `name` now (one whose work ended since the last step is done,
        not running: the world steps in ticks)."""
        now = self.now()
        return [
            q
            for q in self.live.values()
            if q.state == "RUNNING" and name in q.nodes and q.ends_at() > now
        ]

    def told_reclaim_by(self, name: str) -> float | None:
        """When the node was first told to leave for a reclaim, if it was."""
        told = self.told.get(name, []) if name in self.nodes_by_name else []
        return next((at for at, why in told if why.startswith("sco: reclaim")), None)

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
            tuple((q.job.job_id, q.state, q.nodes) for q in self.jobs_by_id.values()),
        )


class SlurmCaller:
    """One installation's tools on a slurmctld it may share with another: a node it
    drains, downs or deletes, or takes a job off, must be of its own installation's
    servers (`own_nodes_only`). What it reads passes through."""

    def __init__(
        self, sim: SimSlurm, installation: str, owner: Callable[[str], str | None]
    ) -> None:
        self.sim = sim
        self.installation = installation
        self.owner = owner  # node name -> the installation of its server, as the cloud says

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)

    def _mine(self, nodes: Sequence[str], what: str) -> None:
        for node in nodes:
            owner = self.owner(node)
            self.sim.breaches.look("own_nodes_only", owner not in (None, self.installation),
                                   f"{self.installation} {what} {owner}'s node {node}")  # fmt: skip

    def drain(self, node: str, reason: str) -> None:
        self._mine([node], "drained")
        self.sim.drain(node, reason)

    def down(self, node: str, reason: str) -> None:
        self._mine([node], "downed")
        self.sim.down(node, reason)

    def delete_node(self, node: str) -> None:
        self._mine([node], "deleted")
        self.sim.delete_node(node)

    def requeue(self, job_ids: Sequence[int]) -> None:
        for i in job_ids:
            q = self.sim.live.get(i)
            self._mine(q.nodes if q is not None else (), f"requeued job {i} off")
        self.sim.requeue(job_ids)
