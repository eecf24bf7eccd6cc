"""The promises the swarm holds sco to: each invariant with what must hold and the
words of the documentation that promise it (`sco lab swarm --list-invariants`).

Where a promise is about what sco does to the world (its servers, its nodes, the
pods and jobs on them), the check reads the world, never sco's account of it: the
region's servers, the simulated schedulers' own calls.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sco.domain.pools import CapacityClass, Pool
from sco.ports import ServerView


@dataclass(frozen=True, slots=True)
class Promise:
    name: str
    holds: str  # what must hold, as the swarm checks it
    doc: str  # where the promise is written (a path in the repository)
    says: str  # its words there


PROMISES = (
    Promise("reclaim_reaches_scheduler",
            "every reclaim notice reaches the node's scheduler (a drain with the reclaim's "
            "deadline), and its work is requeued (Slurm) or evicted (Kubernetes) in time",
            "docs/openstack.md",
            "starts the replacement at once, drains the node and deletes the server before "
            "the deadline"),
    Promise("out_not_counted",
            "no instance counts as READY while sco has its node drained, cordoned or down",
            "docs/control-plane.md",
            "a node sco drained, cordoned or took down is no longer counted ready"),
    Promise("fenced_stops_and_says_so",
            "a replica whose write was refused (a stale fencing token) acts on nothing "
            "more, drops the partition and counts it",
            "docs/replicas.md", "the store raises `FencedOut` and its controller stops"),
    Promise("one_create_per_reservation", "no request id is sent to the cloud twice",
            "docs/architecture.md", "never creates twice for one request"),
    Promise("no_leak",
            "every listed server of sco's has a record once sco has looked, and at the end",
            "docs/architecture.md", "a restarted controller adopts what exists"),
    Promise("own_servers_only", "no installation deletes or drains another's servers",
            "docs/configuration.md", "sco lists, adopts and deletes only servers with its own"),
    Promise("dry_run_changes_nothing",
            "a dry run's round leaves the cloud, the schedulers and fleet state as they were",
            "docs/openstack.md",
            "prints what it would create and delete, and why, without acting"),
    Promise("transitions_on_table",
            "every recorded transition is an edge of the lifecycle table",
            "docs/architecture.md", "Every state change goes through the lifecycle table"),
    Promise("life_in_history",
            "every server sco created has exactly one record, gone when the server is",
            "docs/architecture.md", "leaves one history row and one event in the outbox"),
    Promise("floor_holds",
            "a partition below its floor long after the world last moved, with guaranteed "
            "room and nothing reported, is a violation",
            "docs/configuration.md", "Units kept at all times, on guaranteed capacity if "
            "need be."),
    Promise("cycles_do_not_crash",
            "no cycle or lease round ends in an error that no fault raised",
            "docs/reliability.md", "any other exception is a **crash**"),
    Promise("own_nodes_only",
            "in a Kubernetes or Slurm cluster two installations share, each changes "
            "(labels, cordons, evicts from, drains, downs, requeues off, deletes) only "
            "nodes of its own servers",
            "docs/kubernetes.md",
            "sco labels, cordons, drains and deletes only its own installation's Nodes"),
    Promise("max_units_bound",
            "a partition never holds more spot units than its max_units (servers leaving "
            "apart: under notice, drained or being deleted)",
            "docs/configuration.md", "The most spot units it may hold"),
    Promise("guaranteed_budget_bound",
            "a partition never holds more guaranteed units than its guaranteed budget",
            "docs/configuration.md", "The most guaranteed units it may hold"),
    Promise("own_moves_only_drain",
            "sco requeues Slurm jobs only off nodes it drains for a reclaim",
            "docs/slurm.md", "take idle nodes first and only drain, never requeue"),
    Promise("pinned_left_alone",
            "sco evicts or deletes a do-not-disrupt pod only for a reclaim or a handback",
            "docs/kubernetes.md", "pins its node against sco's own moves"),
    Promise("pinned_not_picked",
            "sco cordons a node running a do-not-disrupt pod only for a reclaim or a "
            "handback",
            "docs/kubernetes.md",
            "the node is never picked when a partition shrinks or guaranteed capacity is "
            "handed back"),
    Promise("reclaimer_within_budget",
            "the reclaimer puts no partition over its disruption budget of servers under "
            "notice at once",
            "docs/contracts.md",
            "what the budget holds back is reported as short, never taken anyway"),
    Promise("deferral_kept",
            "sco never makes a job eligible at once that someone deferred past Slurm's own "
            "hold",
            "docs/slurm.md", "is someone's deferral (`scontrol update StartTime=...`): sco "
            "leaves such a job to wait"),
    Promise("rollout_hands_over_once",
            "while replicas of both lease kinds run (a rolling change of leases.kind), no "
            "write is refused for a stale fence unless a fault stalled a replica",
            "docs/replicas.md", "a rolling change of `leases.kind` hands each partition over once"),
    Promise("unreadable_notice_is_none",
            "a server whose sco:reclaim-at is not a time is not drained for a reclaim",
            "docs/openstack.md", "A value that is not a time is no notice: sco leaves the"),
    Promise("create_only_while_standing",
            "a create that waited for a worker goes out only while its sender leads the "
            "partition and its records stand",
            "docs/control-plane.md", "create that waited for a worker goes out only while it "
            "still stands"),
    Promise("node_token_accepted",
            "a node holding the token sco handed it is served its own contract by the "
            "distributor until that token's expiry",
            "docs/contracts.md", "a node never holds a token the distributor"),
    Promise("handback_creates_nothing",
            "while a handback is in force, its partition's leader creates nothing",
            "docs/control-plane.md", "creates nothing more"),
)  # fmt: skip
INVARIANTS = tuple(p.name for p in PROMISES)


@dataclass
class Breaches:
    """What a simulated side of the world saw sco do against a promise: drained into
    the run's ledger at every step."""

    checked: Counter[str] = field(default_factory=Counter)
    found: list[tuple[str, str]] = field(default_factory=list)  # (invariant, detail)

    def look(self, name: str, broken: bool, detail: str) -> None:
        assert name in INVARIANTS, name
        self.checked[name] += 1
        if broken:
            self.found.append((name, detail))

    def drain(self) -> tuple[Counter[str], list[tuple[str, str]]]:
        out = self.checked, self.found
        self.checked, self.found = Counter(), []
        return out


def bounds(
    breaches: Breaches,
    servers: Iterable[ServerView],
    pools: Mapping[str, Pool],
    limits: Mapping[str, tuple[int, int]],
    leaving: set[str],
) -> None:
    """Each partition's spot units held (servers not `leaving` nor noticed) within its
    max_units, its guaranteed units within its guaranteed budget (`limits`: partition
    -> both)."""
    spot: Counter[str] = Counter()
    guaranteed: Counter[str] = Counter()
    for v in servers:
        pool = pools.get(v.pool)
        gone = v.server_id in leaving or v.notice_deadline is not None
        if v.partition not in limits or gone or pool is None:
            continue
        held = spot if pool.capacity_class is CapacityClass.SPOT else guaranteed
        held[v.partition] += pool.units_per_instance
    for partition, (most, budget) in sorted(limits.items()):
        detail = f"{partition} holds {spot[partition]} spot units, max_units {most}"
        breaches.look("max_units_bound", spot[partition] > most, detail)
        breaches.look("guaranteed_budget_bound", guaranteed[partition] > budget,
                      f"{partition} holds {guaranteed[partition]} guaranteed units, "
                      f"budget {budget}")  # fmt: skip


def budget_room(held: int, max_fraction: float) -> int:
    """The most servers of a partition holding `held` the reclaimer may have under
    notice at once, as `--max-fraction` says (whole servers, rounded down)."""
    return math.floor(max_fraction * held)
