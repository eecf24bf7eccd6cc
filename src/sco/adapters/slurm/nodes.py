"""Slurm nodes for sco's servers: dynamic nodes, drains, requeues before a reclaim.

**The integration model: dynamic nodes** (Slurm 22.05 and later). A server
becomes a Slurm node when its slurmd registers itself (`slurmd -Z`), named
after its server id (`node_name`) and carrying features that say what sco
chose for it: `sco`, `sco-<partition>`, its capacity class (`spot` or
`guaranteed`) and its pool (`pool-<hall>-<flavor>`). A Slurm partition takes
them through a NodeSet on the `sco-<partition>` feature. Slurm refuses a job
whose `--constraint` names a feature no node has, so slurm.conf declares one
FUTURE placeholder node per class (never scheduled) to make `spot` and
`guaranteed` valid before the first such node exists (`sco slurm conf`).

Why not power saving (CLOUD nodes, ResumeProgram)? There Slurm picks which
predeclared node to resume, so Slurm would choose the capacity class and
pool; sco's planner (pools by hazard, a spare, a floor kept with guaranteed
capacity, handing guaranteed back when spot returns) decides those, and a
node must be able to appear with whatever sco chose. Dynamic nodes let it.

**Leaving.** A drain is Slurm's DRAIN with a reason naming the deadline
(`sco: reclaim by <ISO time>`), so the deadline lives in Slurm and a
restarted sco reads it back. For a reclaim, jobs that cannot finish by then
(their time limit ends later) are requeued `requeue_lead_s` before it; a job
that cannot be requeued (`--no-requeue`) is reported and left to run until
the node goes. sco's own moves (a node over its pool's target, a scale-down)
only drain and never requeue, and a node they drained keeps its running jobs
until they end, as Slurm's DRAIN means: it is pinned while it is busy, so its
server goes when the node has drained, not at the drain's deadline (a batch
job cannot move; deleting its node would throw its work away). A reclaim does
not wait. A node whose server is gone is deleted from Slurm, taken DOWN first
while it runs jobs so that Slurm requeues them at once.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from sco.adapters.slurm.model import Job, SlurmNode
from sco.adapters.slurm.tools import SlurmError, SlurmRefused, SlurmTools
from sco.decide.binpack import Size
from sco.domain.times import utc
from sco.ports import Clock, NodeView, SchedulerUnavailable, ServerView

log = logging.getLogger(__name__)

RECLAIM = "reclaim_notice"  # the reason code of a drain that may requeue
_SAFE = re.compile(r"[^A-Za-z0-9_-]+")
_ALNUM = re.compile(r"[^a-z0-9]+")
_DEADLINE = re.compile(r"^sco: (\S+) by (\S+)")


@lru_cache(maxsize=65536)  # read for every node of every listing, every cycle
def node_name(server_id: str) -> str:
    """The Slurm node a server becomes: `sco-` and the first 12 letters and digits of its
    id (48 random bits of a Nova UUID). Short: slurmd names its step sockets after the
    node, twice, under a 108-byte limit."""
    return "sco-" + _ALNUM.sub("", server_id.lower())[:12]


class ListedNames:
    """The node names of a listing's servers (name -> server id), per partition, worked
    out again only for a new listing: a lab region hands out the same listing until a
    server changes, and sco reads it several times a cycle."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Sequence[ServerView], dict[str, str]]] = {}

    def of(self, partition: str, listing: Sequence[ServerView]) -> dict[str, str]:
        last = self._last.get(partition)
        if last is None or last[0] is not listing:
            last = (listing, {node_name(v.server_id): v.server_id for v in listing})
            self._last[partition] = last
        return last[1]


@lru_cache(maxsize=1024)
def partition_feature(partition: str, installation: str = "default") -> str:
    """The feature that makes a node the partition's: `sco-<partition>`, or for a named
    installation (sharing the cluster with another sco) `sco_<installation>_<partition>`:
    installation names hold no '_', so no two installations' features meet."""
    safe = _SAFE.sub("-", partition)
    return f"sco-{safe}" if installation == "default" else f"sco_{installation}_{safe}"


def pool_feature(pool: str) -> str:
    """`pool-<hall>-<flavor>[-<aggregate>]` of a pool id `region/hall/flavor[/aggregate]`."""
    return "pool-" + _SAFE.sub("-", "-".join(pool.split("/")[1:]))


def node_features(
    partition: str, capacity_class: str, pool: str, installation: str = "default"
) -> list[str]:
    """What a node of sco's carries: what its server boots slurmd with (its metadata
    says all of it: `sco:partition`, `sco:class`, `sco:pool`, `sco:installation`)."""
    feature = partition_feature(partition, installation)
    return ["sco", feature, capacity_class, pool_feature(pool)]


def slurm_conf_lines(
    sco_partition: str,
    slurm_partitions: Sequence[str],
    cpus: float,
    memory_mb: float,
    pools: Sequence[tuple[str, str]] = (),
    gres: str = "",
    installation: str = "default",
) -> list[str]:
    """What slurm.conf needs for an sco partition's dynamic nodes: a NodeSet on its
    feature, the Slurm partitions taking it, and one FUTURE placeholder per class that
    makes the class (and pool) features valid before such a node exists. `pools` are
    (class, pool id) pairs."""
    feature = partition_feature(sco_partition, installation)
    nodeset = feature.replace("-", "_")
    lines = [f"NodeSet={nodeset} Feature={feature}"]
    for cls in ("spot", "guaranteed"):
        extra = [pool_feature(p) for c, p in pools if c == cls]
        features = ",".join(["sco", feature, cls, *extra])
        lines.append(
            f"NodeName={feature}-{cls} State=FUTURE Feature={features} CPUs={cpus:g} "
            f"RealMemory={memory_mb:g}" + (f" Gres={gres}" if gres else "")
        )
    lines += [
        f"PartitionName={p} Nodes={nodeset} State=UP MaxTime=INFINITE" for p in slurm_partitions
    ]
    return lines


@lru_cache(maxsize=65536)  # every node's reason, every read: parse each once
def _deadline(reason: str) -> tuple[str, float] | None:
    """(why, when) of a drain reason sco wrote, or None."""
    m = _DEADLINE.match(reason)
    if m is None:
        return None
    try:
        return m.group(1), datetime.strptime(m.group(2), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC
        ).timestamp()
    except ValueError:
        return None


def reclaim_deadline(reason: str) -> float | None:
    """When a node sco (or its agent) drains for a reclaim must be gone, else None."""
    order = _deadline(reason)
    return order[1] if order is not None and order[0] == "reclaim" else None


def cut_short(
    jobs: Sequence[Job], due: Mapping[str, float]
) -> tuple[list[int], list[tuple[Job, float]]]:
    """Of the running jobs on nodes that must go (`due`: node -> deadline), those to
    requeue now (their time limit ends after the deadline), and those that cannot be
    requeued (`--no-requeue`), with their deadline. A job that ends in time is left."""
    requeue: list[int] = []
    cannot: list[tuple[Job, float]] = []
    for job in jobs:
        if job.pending:
            continue
        hits = [due[n] for n in job.nodes if n in due]
        if not hits:
            continue
        if job.end_time is not None and job.end_time <= min(hits):
            continue  # it ends by its time limit before the node has to go
        if job.requeue:
            requeue.append(job.job_id)
        else:
            cannot.append((job, min(hits)))
    return requeue, cannot


_NOT_JOINED = NodeView(joined=False, drained=False)


def _view_of(n: SlurmNode, note: str) -> NodeView:
    order = _deadline(n.reason)
    return NodeView(
        joined=n.up,
        drained=n.drained or (not n.up and n.draining),
        joined_at=n.registered_at,
        busy=n.busy,
        pinned=n.draining and n.busy,  # its jobs end before sco's own move takes it
        note=note,
        # sco's order is its DRAIN reason; a node taken DOWN at its deadline keeps it.
        leaving=order is not None and (n.draining or not n.up),
        reclaim_by=reclaim_deadline(n.reason),
    )


@dataclass(frozen=True, slots=True)
class SlurmPartition:
    """One sco partition on a Slurm cluster."""

    name: str  # sco's partition
    slurm_partitions: tuple[str, ...]  # whose jobs are its demand
    shape: Size  # what one of its nodes holds (the flavor's)
    requeue_lead_s: float = 30.0  # a reclaim's jobs are requeued this long before it
    idle_keep_s: float = 300.0  # an idle node is still wanted this long after its last job
    installation: str = "default"  # this sco's, among those sharing the cluster
    # The node feature naming the partition: read for every node, every cycle.
    feature: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature", partition_feature(self.name, self.installation))


class SlurmView:
    """One read of a cluster's jobs and nodes, shared by its partitions for `ttl_s`."""

    def __init__(self, tools: SlurmTools, slurm_partitions: Sequence[str], ttl_s: float) -> None:
        self.tools = tools
        self.slurm_partitions = sorted(set(slurm_partitions))
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._jobs: list[Job] = []
        self._nodes: list[SlurmNode] = []

    def read(self) -> tuple[list[Job], list[SlurmNode]]:
        """Jobs and nodes as of at most `ttl_s` ago; SchedulerUnavailable when Slurm
        cannot be read."""
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                try:
                    self._jobs = self.tools.jobs(self.slurm_partitions)
                    self._nodes = self.tools.nodes()
                except SlurmError as e:
                    raise SchedulerUnavailable(str(e)) from None
                except Exception as e:  # malformed output: typed by the parser
                    raise SchedulerUnavailable(f"{type(e).__name__}: {e}") from None
                self._at = time.monotonic()
            return self._jobs, self._nodes

    def invalidate(self) -> None:
        with self._lock:
            self._at = float("-inf")


class SlurmNodes:
    """`sco.ports.SchedulerCluster` for the partitions of one Slurm cluster."""

    def __init__(
        self,
        view: SlurmView,
        partitions: Mapping[str, SlurmPartition],
        listing: Callable[[str], Sequence[ServerView]],
        clock: Clock,
    ) -> None:
        self.view = view
        self.tools = view.tools
        self.partitions = dict(partitions)
        self._listing = listing
        self.clock = clock
        # job -> the nodes of the run sco requeued it from: a job running elsewhere since
        # (restarted before a cycle saw it pending) is a new run a reclaim may requeue
        self._requeued: dict[int, tuple[str, ...]] = {}
        self._unrequeueable: set[int] = set()
        self._notes: dict[str, str] = {}  # node -> what its reclaim cuts short
        self.requeued_total = 0
        self._by_name: tuple[object, dict[str, SlurmNode]] = (None, {})  # of the last read
        self._views: dict[str, tuple[SlurmNode, str, NodeView]] = {}  # name -> last view
        self._names = ListedNames()

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        """Reads only (a dry run calls it on a real cluster)."""
        _, nodes = self.view.read()
        if self._by_name[0] is not nodes:
            self._by_name = (nodes, {n.name: n for n in nodes})
        by_name = self._by_name[1]
        listed = self._names.of(partition, self._listing(partition))
        out: dict[str, NodeView] = {}
        kept: dict[str, tuple[SlurmNode, str, NodeView]] = {}
        for name, server_id in listed.items():
            n = by_name.get(name)
            if n is None:
                out[server_id] = _NOT_JOINED
                continue
            note = self._notes.get(name, "")
            seen = self._views.get(name)
            if seen is None or seen[0] is not n or seen[1] != note:
                seen = (n, note, _view_of(n, note))
            kept[name] = seen
            out[server_id] = seen[2]
        self._views = kept  # a node read as before, with the same note, reads the same
        return out

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """Requeue a reclaim's jobs before its deadline and take its node down at it;
        with a listing, delete the nodes whose servers are gone."""
        cfg = self.partitions[partition]
        jobs, nodes = self.view.read()
        self._act_on_deadlines(cfg, jobs, nodes)
        if servers is not None:
            self._forget_gone(cfg, nodes, self._names.of(partition, servers).keys())

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """DRAIN with the deadline in the reason; a node that never registered has
        nothing to drain."""
        name = node_name(server_id)
        why = "reclaim" if reason == RECLAIM else (reason or "leaving")
        try:
            self.tools.drain(name, f"sco: {why} by {utc(drain_by)}")
        except SlurmRefused as e:
            log.info("partition %s: %s not drained (%s)", partition, name, e)
        except SlurmError as e:
            raise SchedulerUnavailable(str(e)) from None
        self.view.invalidate()

    def _act_on_deadlines(
        self, cfg: SlurmPartition, jobs: Sequence[Job], nodes: Sequence[SlurmNode]
    ) -> None:
        """Requeue a reclaim's jobs just before its deadline; take its node down at
        the deadline, which ends what could not be requeued."""
        now = self.clock.now()
        due: dict[str, float] = {}
        for n in nodes:
            if cfg.feature not in n.features or not n.draining:
                continue
            deadline = _deadline(n.reason)
            if deadline is None or deadline[0] != "reclaim":
                continue
            if now >= deadline[1] - cfg.requeue_lead_s:
                due[n.name] = deadline[1]
            if now >= deadline[1] and n.state != "down":
                self._take_down(cfg, n, n.reason)
        self._notes = {k: v for k, v in self._notes.items() if k in {n.name for n in nodes}}
        if due and self._requeue(cfg, jobs, due):
            jobs = self._read_again(cfg, jobs)
        self._restart_requeued(cfg, jobs)

    def _take_down(
        self, cfg: SlurmPartition, n: SlurmNode, reason: str, why: str = "at its reclaim deadline"
    ) -> None:
        try:
            self.tools.down(n.name, reason)
            log.info("partition %s: node %s down %s", cfg.name, n.name, why)
        except SlurmError as e:
            log.info("partition %s: node %s not down yet: %s", cfg.name, n.name, e)
        self.view.invalidate()

    def _requeue(self, cfg: SlurmPartition, jobs: Sequence[Job], due: Mapping[str, float]) -> bool:
        """Requeue the jobs on `due` nodes that would not end in time; True if any was."""
        fresh = [j for j in jobs if self._requeued.get(j.job_id) != j.nodes]
        requeue, cannot = cut_short(fresh, due)
        for job, deadline in cannot:
            if job.job_id not in self._unrequeueable:
                self._unrequeueable.add(job.job_id)
                self._report_unrequeueable(cfg, job, deadline, due)
        if requeue:
            try:
                self.tools.requeue(requeue)
            except SlurmError as e:
                log.warning("partition %s: requeue of %s failed: %s", cfg.name, requeue, e)
                return False
            runs = {j.job_id: j.nodes for j in fresh}
            self._requeued.update({i: runs[i] for i in requeue})
            self.requeued_total += len(requeue)
            log.info("partition %s: requeued %s before their nodes' reclaim", cfg.name, requeue)
            self.view.invalidate()
        return bool(requeue)

    def _read_again(self, cfg: SlurmPartition, jobs: Sequence[Job]) -> Sequence[Job]:
        """The queue after a requeue, so that the jobs just requeued start again at once
        where there is room (a replacement up before the reclaim, an idle node), not a
        cycle later. One Slurm still shows running (completing its requeue), or a read
        that fails, leaves them to the next cycle."""
        try:
            return self.view.read()[0]
        except SchedulerUnavailable as e:
            log.info("partition %s: requeued jobs start at the next cycle: %s", cfg.name, e)
            return jobs

    def _report_unrequeueable(
        self, cfg: SlurmPartition, job: Job, deadline: float, due: Mapping[str, float]
    ) -> None:
        """A --no-requeue job runs until its node goes; the note reaches the node's
        termination event."""
        note = (
            f"job {job.job_id} cannot be requeued (--no-requeue): it ends when the node "
            f"goes at {utc(deadline)}"
        )
        log.warning("partition %s: %s (on %s)", cfg.name, note, ",".join(job.nodes))
        for name in job.nodes:
            if name in due:
                prior = self._notes.get(name)
                self._notes[name] = f"{prior}; {note}" if prior else note

    def _restart_requeued(self, cfg: SlurmPartition, jobs: Sequence[Job]) -> None:
        """Requeued jobs that are pending again may start at once on other nodes.

        Slurm holds a requeued job back for the credential lifetime (AuthInfo
        cred_expire, 120 s by default) so that it cannot start again on a node that
        still has its old credential; its old node is draining and about to go, so
        the wait only delays the work. A job that runs again can be requeued again
        by a later reclaim. Jobs requeued by another hand (the node's agent, which may
        be gone with its node before it could say so, or an admin) are held the same
        way: they are made eligible too. A begin time past Slurm's own hold is someone's
        deferral (issue 40: sco undid it): such a job is left to wait, sco's own too."""
        now = self.clock.now()
        seen = {j.job_id: j for j in jobs}
        held = {
            j.job_id
            for j in jobs
            if j.held_after_requeue(now) and j.partition in cfg.slurm_partitions
        }
        ours = {
            i for i in self._requeued if i in seen and seen[i].pending and not seen[i].deferred(now)
        }
        again = sorted(ours | held)
        self._requeued = {i: on for i, on in self._requeued.items() if i in seen}
        self._unrequeueable &= seen.keys()
        if not again:
            return
        for i in again:
            self._requeued.pop(i, None)
        try:
            self.tools.start_now(again)
        except SlurmError as e:
            log.info("partition %s: requeued jobs %s wait for Slurm: %s", cfg.name, again, e)

    def _forget_gone(
        self, cfg: SlurmPartition, nodes: Sequence[SlurmNode], listed: Collection[str]
    ) -> None:
        """Delete the nodes of servers that are gone (their slurmd with them): until
        slurmd's timeout Slurm would think them idle, and send jobs there. A busy one
        is taken DOWN first: Slurm then requeues its jobs at once, not a slurmd
        timeout later (a reclaim without notice, or a notice that could not land)."""
        deleted = False
        for n in nodes:
            if cfg.feature not in n.features or n.name in listed:
                continue
            if n.busy and n.state != "down":
                self._take_down(cfg, n, "sco: server gone", "its server is gone")
            elif not n.busy:
                try:
                    self.tools.delete_node(n.name)
                    log.info("partition %s: node %s deleted: its server is gone", cfg.name, n.name)
                    deleted = True
                except SlurmError as e:
                    log.info("partition %s: node %s not deleted yet: %s", cfg.name, n.name, e)
        if deleted:
            self.view.invalidate()
