"""Prometheus metrics of the controllers, fed by their cycle reports.

Placement, as kube-state-metrics would export it:
- `sco_placement_state{partition, state}`: units `placed` (ready toward the
  target), `unplaced` (target not yet ready) and `mismatch` (live units the
  plan does not want where they are);
- `sco_placement_delay_seconds{partition}`: from an instance's request (when
  the plan wanted it) to its node being ready, by the provider's clock;
- `sco_partition_degraded{partition}`: 1 while a partition cannot observe or act.

Acting, each labelled by its reason code (`sco.decide.acquirer.Reason`):
- `sco_actions_total{partition, action, reason}`: instances created, drained,
  deleted, expired and closed;
- `sco_reclaims_total{partition, pool, kind}`: reclaims seen, `notice` (announced)
  or `vanished` (no notice);
- `sco_replacements_total{partition, pool}`: instances created to replace reclaims;
- `sco_pool_excluded{partition, pool}`: 1 while the partition plans the pool as
  excluded or degraded (the watcher's word, acted on);
- `sco_cycle_seconds{partition}`: how long a cycle took;
- `sco_partition_last_cycle_timestamp_seconds{partition}`: when the partition's
  last cycle ended (on the replica leading it);
- `sco_partition_instances{partition}`: live instances held;
- `sco_partition_handback{partition}`: 1 while the partition is being handed back;
- `sco_unfit_work{partition}`: jobs or pods waiting that no node of the partition
  could ever run (too big, or asking for labels or tolerations it lacks): not
  counted in the target, and the scheduler's own events say why;
- `sco_partition_floor_units`, `sco_partition_target_units` and
  `sco_partition_ready_units{partition}`: the floor, the target, and the units
  ready in their scheduler (any class): the floor is broken while ready < floor;
- `sco_instances{partition, class, state}`: the fleet by capacity class and
  lifecycle state;
- `sco_partition_cost_per_hour{partition}`: what the live instances cost an hour
  at their pools' current prices;
- `sco_scores_computed_timestamp_seconds{partition}`: when the pool scores the
  partition plans with were computed (0: none yet);
- `sco_partition_leader{partition, replica}`: 1 where this replica holds the
  partition's lease, 0 for every other partition it knows (so the sum over
  replicas is 0, not absent, while nobody leads).

Least privilege (`CredentialMetrics`, docs/security.md):
- `sco_credential_excess`: the ways the cloud credential could do more than sco
  needs (admin role, system or domain scope, roles beyond `provider.roles`), as
  found at start; 0 when it is as narrow as sco needs;
- `sco_foreign_servers{project}`: servers of projects not sco's in its latest
  listings, left alone;
- `sco_credential_version{source}`: the version of the credential in use where it
  is kept (OpenBao KV v2): a rotation is done when every replica shows the new one;
- `sco_foreign_refusals_total`: actions by server id (delete, notice, node token)
  refused because the server was not in sco's projects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sco.engine.cycle import CycleReport
from sco.ports import Credential

DELAY_BUCKETS = (5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1800, 3600)
CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.state = Gauge(
            "sco_placement_state",
            "Units of demand by placement state.",
            ["partition", "state"],
            registry=r,
        )
        self.delay = Histogram(
            "sco_placement_delay_seconds",
            "Seconds from an instance's request to its node being ready.",
            ["partition"],
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.degraded = Gauge(
            "sco_partition_degraded",
            "1 while the partition cannot observe or act.",
            ["partition"],
            registry=r,
        )
        self.actions = Counter(
            "sco_actions",
            "Instances acted on, by action and reason code.",
            ["partition", "action", "reason"],
            registry=r,
        )
        self.reclaims = Counter(
            "sco_reclaims",
            "Reclaims seen, announced (notice) or not (vanished).",
            ["partition", "pool", "kind"],
            registry=r,
        )
        self.replacements = Counter(
            "sco_replacements",
            "Instances created to replace reclaimed ones.",
            ["partition", "pool"],
            registry=r,
        )
        self.excluded = Gauge(
            "sco_pool_excluded",
            "1 while the partition plans the pool as excluded or degraded.",
            ["partition", "pool"],
            registry=r,
        )
        self.cycle = Histogram(
            "sco_cycle_seconds",
            "Seconds a partition's cycle took.",
            ["partition"],
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.phase = Histogram(
            "sco_cycle_phase_seconds",
            "Seconds of a partition's cycle by phase (observe_cloud, observe_scheduler, sync, "
            "signals, plan, act, publish): where a slow cycle spends its time.",
            ["partition", "phase"],
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.last_cycle = Gauge(
            "sco_partition_last_cycle_timestamp_seconds",
            "When the partition's last cycle ended, in seconds since the epoch.",
            ["partition"],
            registry=r,
        )
        self.held = Gauge(
            "sco_partition_instances",
            "Live instances the partition holds.",
            ["partition"],
            registry=r,
        )
        self.handback = Gauge(
            "sco_partition_handback",
            "1 while the partition is being handed back.",
            ["partition"],
            registry=r,
        )
        self.unfit = Gauge(
            "sco_unfit_work",
            "Waiting jobs or pods no node of the partition could ever run.",
            ["partition"],
            registry=r,
        )
        self.floor = Gauge(
            "sco_partition_floor_units", "The partition's floor.", ["partition"], registry=r
        )
        self.target = Gauge(
            "sco_partition_target_units", "The partition's target.", ["partition"], registry=r
        )
        self.ready = Gauge(
            "sco_partition_ready_units",
            "Units ready in their scheduler, any class.",
            ["partition"],
            registry=r,
        )
        self.instances = Gauge(
            "sco_instances",
            "Instances by capacity class and lifecycle state.",
            ["partition", "class", "state"],
            registry=r,
        )
        self.cost = Gauge(
            "sco_partition_cost_per_hour",
            "What the partition's live instances cost an hour, at current prices.",
            ["partition"],
            registry=r,
        )
        self.scored = Gauge(
            "sco_scores_computed_timestamp_seconds",
            "When the pool scores in use were computed (0: none).",
            ["partition"],
            registry=r,
        )
        self.leader = Gauge(
            "sco_partition_leader",
            "1 where this replica holds the partition's lease.",
            ["partition", "replica"],
            registry=r,
        )
        self.fenced = Counter(
            "sco_partition_fenced_total",
            "Times the database refused this replica's write to the partition: another "
            "writer holds a newer fencing token, and this replica's controller stopped.",
            ["partition"],
            registry=r,
        )
        self._excluded: dict[str, set[str]] = {}
        self._instances: dict[str, set[tuple[str, str]]] = {}

    def observe(self, report: CycleReport) -> None:
        p = report.partition
        self.degraded.labels(p).set(1 if report.degraded else 0)
        self.cycle.labels(p).observe(report.took_s)
        for phase, took in report.phases_s.items():
            self.phase.labels(p, phase).observe(took)
        self.last_cycle.labels(p).set(report.at + report.took_s)
        if report.placement is None:
            return  # the cycle could not observe: nothing else is known
        self.state.labels(p, "placed").set(report.placement.placed)
        self.state.labels(p, "unplaced").set(report.placement.unplaced)
        self.state.labels(p, "mismatch").set(report.placement.mismatch)
        self.held.labels(p).set(report.held)
        self.handback.labels(p).set(1 if report.handback else 0)
        self.unfit.labels(p).set(report.unfit_work)
        self.floor.labels(p).set(report.floor_units)
        self.target.labels(p).set(report.target_units)
        self.ready.labels(p).set(report.ready_units)
        self.cost.labels(p).set(report.cost_per_h)
        self.scored.labels(p).set(report.scored_at)
        seen = set(report.instances)
        for cls, state in seen | self._instances.get(p, set()):
            self.instances.labels(p, cls, state).set(report.instances.get((cls, state), 0))
        self._instances[p] = seen
        for delay in report.ready_delays_s:
            self.delay.labels(p).observe(delay)
        for (action, reason), n in report.acted.items():
            self.actions.labels(p, action, reason).inc(n)
        for (pool, kind), n in report.reclaims.items():
            self.reclaims.labels(p, pool, kind).inc(n)
        for pool, n in report.replaced.items():
            self.replacements.labels(p, pool).inc(n)
        now = set(report.excluded)
        for pool in now | self._excluded.get(p, set()):
            self.excluded.labels(p, pool).set(1 if pool in now else 0)
        self._excluded[p] = now

    def forget(self, partition: str) -> None:
        """A partition this replica no longer leads: its gauges go, the new leader's come
        (counters stay: they count what this replica did)."""
        for state in ("placed", "unplaced", "mismatch"):
            with contextlib.suppress(KeyError):
                self.state.remove(partition, state)
        gauges = (self.floor, self.target, self.ready, self.cost, self.unfit, self.scored)
        cycles = (self.cycle, self.last_cycle)
        for metric in (self.delay, self.degraded, self.held, self.handback, *cycles, *gauges):
            with contextlib.suppress(KeyError):
                metric.remove(partition)
        for cls, state in self._instances.pop(partition, set()):
            with contextlib.suppress(KeyError):
                self.instances.remove(partition, cls, state)
        for pool in self._excluded.pop(partition, set()):
            with contextlib.suppress(KeyError):
                self.excluded.remove(partition, pool)

    def leading(self, replica: str, partitions: Iterable[str], held: Container[str]) -> None:
        """Which of the partitions this replica knows it leads now."""
        for p in partitions:
            self.leader.labels(p, replica).set(1 if p in held else 0)


class CredentialMetrics:
    """What the cloud credential could do beyond sco's needs, and the foreign servers
    sco has left alone; `refresh` reads the provider's counts (each cycle)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        excess: Sequence[str],
        foreign: Callable[[], Mapping[str, int]],
        refused: Callable[[], int],
        held: Callable[[], Credential | None] = lambda: None,
    ) -> None:
        self.excess = Gauge(
            "sco_credential_excess",
            "Ways the cloud credential could do more than sco needs (0: none).",
            registry=registry,
        )
        self.excess.set(len(excess))
        self.foreign = Gauge(
            "sco_foreign_servers",
            "Servers of projects not sco's in its latest listings, left alone.",
            ["project"],
            registry=registry,
        )
        self.refused = Counter(
            "sco_foreign_refusals",
            "Actions by server id refused: the server is not in sco's projects.",
            registry=registry,
        )
        self.version = Gauge(
            "sco_credential_version",
            "Version of the cloud credential in use where it is kept (OpenBao KV v2): "
            "after a rotation, the old credential may go once every replica shows the new.",
            ["source"],
            registry=registry,
        )
        self._read_foreign = foreign
        self._read_refused = refused
        self._read_held = held
        self._projects: set[str] = set()
        self._refused_seen = 0

    def refresh(self) -> None:
        held = self._read_held()
        if held is not None and held.version is not None:
            self.version.labels(held.source).set(held.version)
        counts = self._read_foreign()
        for project in self._projects | set(counts):
            self.foreign.labels(project).set(counts.get(project, 0))
        self._projects |= set(counts)
        total = self._read_refused()
        if total > self._refused_seen:
            self.refused.inc(total - self._refused_seen)
            self._refused_seen = total
