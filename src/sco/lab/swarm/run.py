"""Run one seed's world to its end, faults and all, checking the invariants as it goes.

The loop advances a simulated clock in steps of `TICK_S`: the region applies what
its traces and the adversary scheduled, the schedulers run their work, the faults
of the moment take hold, each replica tends its leases and cycles the partitions
it leads when they are due, the signal jobs run, and the checks look.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sco.adapters.slurm.nodes import partition_feature
from sco.domain.lifecycle import State
from sco.engine.clock import ManualClock
from sco.lab.swarm.adversary import Adversary
from sco.lab.swarm.checks import Ledger, Notice, Violation, check_history, check_lives
from sco.lab.swarm.faults import DatabaseDown, EventLogDown, HistoryDown, Killed, Schedule
from sco.lab.swarm.promises import Breaches, bounds
from sco.lab.swarm.slurm import SimSlurm
from sco.lab.swarm.spec import BLUE, GREEN, START_S, Kind, WorldSpec
from sco.lab.swarm.stage import Hooks
from sco.lab.swarm.typos import Typos
from sco.lab.swarm.world import (
    KUBE_GRACE_S,
    REQUEUE_LEAD_S,
    STEP_S,
    Installation,
    Replica,
    node_life,
    node_name_of,
    region_of,
    running_on,
)
from sco.ports import NodeView

log = logging.getLogger(__name__)

TICK_S = STEP_S
DRY_RUN_EVERY_S = 1800.0


@dataclass
class SeedResult:
    seed: int
    simulated_s: float
    faults: int
    violations: list[Violation]
    misses: dict[str, int]
    checked: dict[str, int]
    cycles: int
    wall_s: float
    notes: list[str] = field(default_factory=list)
    state: str = "memory"  # what fleet state it ran on
    effective: dict[str, int] = field(default_factory=dict)  # kind -> effects

    @property
    def ok(self) -> bool:
        return not self.violations


class Swarm(Hooks):
    """One world (see `sco.lab.swarm.world`), run from its spec."""

    def __init__(self, spec: WorldSpec, folder: Path, state: str = "memory") -> None:
        self.spec = spec
        self.state = state
        self.clock = ManualClock(START_S)
        self.region = region_of(spec)
        self.schedule = Schedule(spec.faults, START_S, self.clock.now)
        self.ledger = Ledger(START_S)
        self.breaches = Breaches()  # the swarm's own sightings, with the twins'
        self.typos = Typos(self.breaches)
        self._leaving: set[str] = set()  # blue's servers it sent a delete for
        self.cycles = 0
        self.notes: list[str] = []
        self.blue = Installation(
            BLUE, spec, spec.partitions, self.region, self.clock, self, folder, spec.replicas, state
        )
        self.green: Installation | None = None
        if spec.second_installation:
            # Another sco in the project, a partition named as one of blue's; a Slurm
            # or Kubernetes one shares blue's cluster.
            first = spec.partitions[0]
            kind = first.kind
            plan = type(first)(first.name, kind, 1, 3, ((0.0, 2),), ())
            shared = {first.name: self.blue.twins[first.name]} if kind != "static" else None
            self.green = Installation(
                GREEN, spec, [plan], self.region, self.clock, self, folder, ("r1",), state, shared
            )
        self.adversary = Adversary(self)
        # server -> (partition, installation, reclaim told at, its node joined at)
        self._seen: dict[str, tuple[str, str | None, float | None, float | None]] = {}
        self._created: dict[str, tuple[str, float]] = {}  # blue's servers: partition, seen
        self._gone_at: dict[str, float] = {}
        self._in_takeover = False
        self._next_dry_run = START_S + DRY_RUN_EVERY_S / 2
        self._next_signals = START_S

    # ------------------------------------------------------------ the loop

    def run(self) -> SeedResult:
        wall = time.perf_counter()
        end = START_S + self.spec.duration_s + self.spec.calm_s
        try:
            while self.clock.now() < end:
                self.step(self.clock.now() + TICK_S)
            self.finish()
        finally:
            self.blue.close()
            if self.green is not None:
                self.green.close()
        return SeedResult(
            seed=self.spec.seed,
            simulated_s=end - START_S,
            faults=len(self.spec.faults),
            violations=list(self.ledger.violations),
            misses=dict(self.ledger.misses),
            checked=dict(self.ledger.checked),
            cycles=self.cycles,
            wall_s=time.perf_counter() - wall,
            notes=self.notes,
            state=self.state,
            effective=dict(self.schedule.effects),
        )

    def step(self, t: float) -> None:
        self.region.advance_to(max(t, self.region.now))
        self.clock.set(max(t, self.clock.now()))
        self._servers()
        self.adversary.step()
        for inst in (self.blue, self.green):
            if inst is None:
                continue
            for name, twin in inst.twins.items():
                if inst is self.blue or name not in self.blue.twins:  # a shared one once
                    twin.step()
            for slot in sorted(inst.replicas):
                if slot in inst.replicas and not self.adversary.paused(inst, slot):
                    self._turn(inst, inst.replicas[slot])
            self._signals(inst)
            self._agents(inst)
        self._promises()
        if self.clock.now() >= self._next_dry_run:
            self._next_dry_run += DRY_RUN_EVERY_S
            self.adversary.dry_run()

    def _turn(self, inst: Installation, r: Replica) -> None:
        now = self.clock.now()
        # The workers run beside the lease round: the seed says which goes first.
        early = r.calls.rng.random() < 0.5
        if early:
            self._workers(r)
        if now >= r.next_tend:
            r.next_tend = now + r.runner.config.lease_every_s
            if not self.guard(inst, r, r.runner.tend_leases):
                return
            if r.runner.pump is not None:
                self.guard(inst, r, r.runner.pump.step)
        if not early:
            self._workers(r)
        for name in sorted(r.runner.controllers):
            if now < r.next_cycle.get(name, 0.0) or r.slot not in inst.replicas:
                continue
            r.next_cycle[name] = now + self.spec.interval_s
            self.cycle(inst, r, name)

    def _agents(self, inst: Installation) -> None:
        """Every server of `inst` holding a token asks the distributor for its contract."""
        live = [v.server_id for p in inst.plans for v in self.region.list(p, inst.name)]
        asked, refused = inst.agents.ask(live)
        self.ledger.checked["node_token_accepted"] += asked
        for sid, why in refused:
            self.ledger.violate("node_token_accepted", self.now(), f"{inst.name}'s {sid}: {why}")

    def _workers(self, r: Replica) -> None:
        stall = self.schedule.active(Kind.CALLS_STALLED, r.slot)
        if stall is not None and r.calls.queue:
            self.schedule.took(Kind.CALLS_STALLED, len(r.calls.queue))
        r.calls.step(stall is not None)

    def cycle(self, inst: Installation, r: Replica, name: str) -> None:
        """One cycle of `name` by `r`, and what the checks learn of it."""
        r.cloud.partition = name
        del r.nodes.tends[:]
        fenced_before = r.runner.fenced.get(name, 0)
        races = r.store.lost_races
        # What the world allowed this cycle, whatever sco made of it: the cloud could be
        # listed and fleet state written, and the partition's scheduler answered.
        s = self.schedule
        cloud = not (
            s.active(Kind.LIST_ERROR)
            or s.active(Kind.CREDENTIAL_EXPIRED)
            or s.active(Kind.DATABASE_DOWN)
        )
        twin = inst.twins.get(name)
        reached = twin is None or twin.available  # away as the world has it, not as planned
        report = None

        def once() -> None:
            nonlocal report
            report = r.runner.cycle_once(name)

        self.guard(inst, r, once)
        r.cloud.partition = ""
        self.cycles += 1
        now = self.clock.now()
        # A refused write must end the cycle there, drop the partition and count it.
        refused = self.adversary.fenced.pop((r.slot, name), None) is not None
        silent = r.runner.fenced.get(name, 0) == fenced_before or name in r.runner.held
        if refused and inst is self.blue and silent:
            self.ledger.violate(
                "fenced_stops_and_says_so",
                now,
                f"{r.name}'s write to {name} was refused; it kept the partition silently",
            )
        if inst is not self.blue or report is None:
            return
        log = self.ledger.cycles.setdefault(name, [])
        # When it reached the scheduler, not when it ended (a slow cloud stretches it).
        for _, at in [x for x in r.nodes.tends if x[0] == name] or [(name, now)]:
            log.append((at, cloud and r.store.lost_races == races, reached))
        # What a quiet cycle leaves is what the last one left: look after those that
        # acted, and every fourth one.
        moved = report.transitions or report.created or report.drained or report.deleted
        if not report.degraded and (moved or len(log) % 4 == 0):
            self._after_cycle(name)

    def guard(self, inst: Installation, r: Replica, fn: Callable[[], object]) -> bool:
        """Run a replica's step as its process would: a failure is logged and the next
        turn comes; a kill ends the process."""
        self.ledger.checked["cycles_do_not_crash"] += 1
        try:
            fn()
        except Killed:
            self.adversary.killed(inst, r.slot)
            return False
        except DatabaseDown as e:
            log.debug("%s: %s", r.name, e)
            return False
        except Exception as e:  # what a fault did not raise itself is a defect of sco's
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.ledger.violate(
                "cycles_do_not_crash",
                self.now(),
                f"{r.name}: {type(e).__name__}: {e} "
                f"({Path(where.filename).name}:{where.lineno} {where.name})",
            )
            return False
        return True

    def _signals(self, inst: Installation) -> None:
        """The watcher and the scorer: their own processes, on their own schedules."""
        now = self.clock.now()
        if self.schedule.active(Kind.DATABASE_DOWN) or now < self._next_signals:
            return
        self._next_signals = now + 15.0
        try:
            if inst.relay():
                inst.watcher.poll(limit=100_000)
            if inst.scorer.due(now):
                inst.scorer.run(now)
        except (EventLogDown, HistoryDown) as e:  # each job tries again on its next turn
            log.debug("%s's signal jobs: %s", inst.name, e)

    # ------------------------------------------------------------ what the checks read

    def _promises(self) -> None:
        """The bounds of blue's partitions, read from the region; then what the swarm
        and the simulated schedulers saw sco do against a promise, into the ledger."""
        limits = {p.name: (p.max_units, p.max_units) for p in self.spec.partitions}
        mine = [
            v for v in self.region.all_servers() if self.region.installation_of(v.server_id) == BLUE
        ]
        leaving = {v.server_id for v in mine if self._leaving_now(v.partition, v.server_id)}
        pools = {p.id: p for p in self.region.pools()}
        bounds(self.breaches, mine, pools, limits, leaving)
        if self.now() <= self.adversary.mixed_until:  # each step of a rollout is looked at
            self.breaches.look("rollout_hands_over_once", False, "")
        for twin in self.blue.twins.values():
            self.schedule.took(Kind.SCHEDULER_DOWN, twin.refused)
            twin.refused = 0
        for source in [self.breaches, *(t.breaches for t in self.blue.twins.values())]:
            checked, found = source.drain()
            self.ledger.checked.update(checked)
            for name, detail in found:
                self.ledger.violate(name, self.now(), detail)

    def _servers(self) -> None:
        """Servers that appeared, were noticed, or are gone since the last step: the
        schedulers learn of nodes that booted or went, and the checks of notices."""
        now = self.clock.now()
        current: dict[str, tuple[str, str | None, float | None, float | None]] = {}
        nodes: dict[str, NodeView] = {}
        for inst in (self.blue, self.green):
            if inst is not None:
                for p in inst.plans:
                    nodes.update(self.region.nodes(p, inst.name))
        for v in self.region.all_servers():
            who = self.region.installation_of(v.server_id)
            # Read now what a static partition's node was told: gone, it is forgotten.
            told = self.region.reclaim_told_at(v.server_id)
            node = nodes.get(v.server_id)
            since = node.joined_at if node is not None and node.joined else None
            current[v.server_id] = (v.partition, who, told, since)
            if who == BLUE:
                self._created.setdefault(v.server_id, (v.partition, now))
                if v.notice_deadline is not None:
                    seen = self.ledger.noticed.get(v.server_id)
                    if seen is None and self._leaving_already(v.server_id):
                        continue  # sco was deleting it already: nothing left to tell
                    if seen is None:
                        self.ledger.noticed[v.server_id] = Notice(
                            v.partition, now, v.notice_deadline
                        )
                    elif v.notice_deadline < seen.deadline:
                        seen.deadline = v.notice_deadline
        for sid, (partition, who, told, since) in self._seen.items():
            if sid not in current:
                self._gone(partition, who, sid, told, since)
        self._seen = current
        for inst in (self.blue, self.green):
            if inst is not None:
                self._boot(inst)

    def _leaving_now(self, partition: str, sid: str) -> bool:
        """Whether sco is taking the server away, as the world sees it: its delete was
        sent, or its node drained or cordoned (a notice counts where it is read)."""
        if sid in self._leaving or self.region.is_deleting(sid) or self.region.is_draining(sid):
            return True
        twin = self.blue.twins.get(partition)
        return twin is not None and twin.out_by_sco(node_name_of(twin, sid))

    def _leaving_already(self, server_id: str) -> bool:
        """Whether sco had sent (or tried to send) the server's delete before a notice
        came: its node was told to leave before, and is drained or past its deadline."""
        if self.region.is_deleting(server_id):
            return True
        state = self.blue.store.state_of_server(server_id)
        return state in ("terminating", "failed", "gone")

    def _boot(self, inst: Installation) -> None:
        for name, twin in inst.twins.items():
            for v in inst.tenant.list(name):
                node = inst.region.nodes(name, inst.name).get(v.server_id)
                if node is None or not node.joined:
                    continue
                if isinstance(twin, SimSlurm):
                    feature = partition_feature(name, inst.name)
                    twin.register(node_name_of(twin, v.server_id), frozenset({"sco", feature}))
                else:
                    twin.register(node_name_of(twin, v.server_id), v.server_id, inst.name)

    def _gone(
        self, partition: str, who: str | None, sid: str, told: float | None, since: float | None
    ) -> None:
        """A server is gone: if noticed, its node must have been told and its work
        moved, wherever sco had the chance (from when the node existed)."""
        inst = self.blue if who == BLUE else self.green
        if inst is None:
            return
        twin = inst.twins.get(partition)
        now = self.clock.now()
        self._gone_at[sid] = now
        if twin is not None:
            since, told = node_life(twin, sid)
        else:
            told = self.region.reclaim_told_at(sid)
        if inst is self.blue and since is not None:
            self.ledger.told(partition, sid, told, now, since)
            if twin is not None:
                slurm = isinstance(twin, SimSlurm)
                window = REQUEUE_LEAD_S if slurm else KUBE_GRACE_S
                for what in running_on(twin, sid):
                    self.ledger.cut(partition, sid, what, now, window, since, not slurm)
        if twin is not None:
            twin.server_gone(node_name_of(twin, sid))

    def _after_cycle(self, partition: str) -> None:
        inst = self.blue
        records = inst.store.instances(partition)
        servers = [v.server_id for v in inst.tenant.list(partition)]
        twin = inst.twins.get(partition)
        out = {
            sid
            for sid in servers
            if (twin is not None and twin.out_by_sco(node_name_of(twin, sid)))
            or (twin is None and self.region.is_draining(sid))
        }
        self.ledger.records(partition, records, servers, out, self.clock.now())
        self.adversary.floor(partition, records)

    def _seen_by_sco(self, now: float) -> set[str]:
        """The servers sco could have recorded: listed while a cycle of their partition
        observed, and not gone in the last two cycles (the next has not looked yet).
        One made and gone unseen (its create's answer lost) has no record to read."""
        out = set()
        settle = 2 * self.spec.interval_s + TICK_S
        for sid, (partition, seen) in self._created.items():
            gone = self._gone_at.get(sid)
            if gone is not None and now - gone <= settle:
                continue
            end = gone if gone is not None else now
            looks = self.ledger.cycles.get(partition, [])
            if any(seen < at < end and observed for at, observed, _ in looks):
                out.add(sid)
        return out

    def finish(self) -> None:
        now = self.clock.now()
        check_history(self.ledger, self.blue.store, now)
        alive = {sid for sid, (_, who, *_) in self._seen.items() if who == BLUE}
        check_lives(self.ledger, self.blue.store, self._seen_by_sco(now), alive, now)
        for name in self.blue.plans:
            live = [i for i in self.blue.store.instances(name) if i.state is not State.GONE]
            # A create a worker sent after the last cycle: its REQUESTED records stand
            # for it until a listing or its answer names the server.
            asked = {i.request_id for i in live if i.server_id is None}
            views = self.blue.tenant.list(name)
            listed = {v.server_id for v in views if v.request_id not in asked}
            missing = listed - {i.server_id for i in live}
            for sid in sorted(missing):
                self.ledger.violate(
                    "no_leak", now, f"server {sid} ({name}) has no record at the end"
                )


def run_seed(spec: WorldSpec, state: str = "memory") -> SeedResult:
    """Run one world to its end in a scratch folder (in memory where the machine has
    a tmpfs), sco's own logging held back: the result says what went wrong."""
    shm = Path("/dev/shm")
    where = str(shm) if shm.is_dir() else None
    quiet = logging.getLogger("sco")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(prefix=f"sco-swarm-{spec.seed}-", dir=where) as folder:
            return Swarm(spec, Path(folder), state).run()
    finally:
        quiet.setLevel(level)


def simulated_days(results: list[SeedResult]) -> float:
    return math.fsum(r.simulated_s for r in results) / 86400.0
