"""The adversary: the seed's faults of the moment, the work the schedulers get, the
operator's orders, and the checks that need the whole world (dry runs, the floor).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.decide.policies import ScoPolicy
from sco.decide.reclaim import Budget
from sco.domain.demand import HANDBACK
from sco.domain.instances import Instance
from sco.domain.lifecycle import HAS_SERVER, State
from sco.engine import builder
from sco.engine.builder import FleetState, Ports
from sco.engine.clock import ManualClock
from sco.engine.cycle import ControllerConfig
from sco.engine.reclaimer import Reclaimer
from sco.engine.routing import NodeRouter
from sco.lab.region import SimRegion
from sco.lab.swarm.checks import Ledger
from sco.lab.swarm.faults import Schedule
from sco.lab.swarm.promises import Breaches, budget_room
from sco.lab.swarm.slurm import SimSlurm
from sco.lab.swarm.spec import BLUE, START_S, Fault, Kind, WorldSpec
from sco.lab.swarm.typos import Typos
from sco.lab.swarm.world import LEASE_TTL_S, Installation, Replica, fresh_state
from sco.lab.twins.fleet import MemoryFleetStore
from sco.ports import ServerView

ROLLING_STEP_S = 3 * LEASE_TTL_S  # between two replicas' restarts in a rolling upgrade

# A partition below its floor this long after the world last moved (a fault, a
# reclaim, a restart) has had time for guaranteed capacity to be created and join.
FLOOR_GRACE_S = 2 * 70.0 + 4 * 30.0 + LEASE_TTL_S + 60.0


class Arena(Protocol):
    """What the adversary needs of the running swarm (`sco.lab.swarm.run.Swarm`)."""

    spec: WorldSpec
    clock: ManualClock
    region: SimRegion
    schedule: Schedule
    ledger: Ledger
    breaches: Breaches
    typos: Typos
    notes: list[str]
    blue: Installation

    def slow(self, seconds: float) -> None: ...

    def guard(self, inst: Installation, r: Replica, fn: Callable[[], object]) -> bool:
        """Run a replica's step as its process would; False when it failed or died."""
        ...

    def cycle(self, inst: Installation, r: Replica, name: str) -> None: ...


class Adversary:
    def __init__(self, swarm: Arena) -> None:
        self.swarm = swarm
        self.rng = random.Random(swarm.spec.seed * 7919 + 1)
        self.fenced: dict[tuple[str, str], float] = {}  # (slot, partition) -> refused at
        self.restarts: list[tuple[float, Installation, str]] = []
        self.jobs = {p.name: 0 for p in swarm.spec.partitions}  # next job to submit
        self.handed: set[str] = set()
        self.rolling: list[tuple[float, str]] = []  # (when, slot) of a rolling restart
        self.mixed_until = float("-inf")  # both lease kinds may run until then
        self.disturbed = START_S  # when the world last moved under sco's feet
        self.short_since: dict[str, float] = {}

    @property
    def now(self) -> float:
        return self.swarm.clock.now()

    # ------------------------------------------------------------ each step

    def step(self) -> None:
        s = self.swarm.schedule
        if s.any_active(self.now - START_S):
            self.disturbed = self.now
        blue = self.swarm.blue
        for name, twin in blue.twins.items():
            twin.available = s.active(Kind.SCHEDULER_DOWN, name) is None
        for slot, r in blue.replicas.items():
            skew = s.active(Kind.CLOCK_SKEW, slot)
            r.clock.skew_s = skew.value if skew is not None else 0.0
            if r.clock.skew_s:
                s.took(Kind.CLOCK_SKEW)
        for at, slot in list(self.rolling):
            if self.now >= at:
                self.rolling.remove((at, slot))
                if slot in blue.replicas:
                    blue.stop(slot)
                    blue.start(slot)
                self.disturbed = self.now
        for at, inst, slot in list(self.restarts):
            if self.now >= at:
                self.restarts.remove((at, inst, slot))
                inst.start(slot)
                self.disturbed = self.now
        self._instant(s)
        self._handback(s)
        self._workload()

    def _instant(self, s: Schedule) -> None:
        for kind, act in (
            (Kind.NOTICE, self._notice),
            (Kind.NOTICE_MALFORMED, self._mistype),
            (Kind.RECLAIM, self._reclaim),
            (Kind.SCHEDULER_FORGETS, self._forget),
            (Kind.TOKEN_RESET, self._token_reset),
        ):
            while (fault := s.once(kind)) is not None:
                act(fault)
                self.disturbed = self.now

    def _handback(self, s: Schedule) -> None:
        store = self.swarm.blue.store
        for name in self.swarm.blue.plans:
            on = s.active(Kind.HANDBACK, name) is not None
            if on and name not in self.handed:
                store.put_intent(name, HANDBACK, self.now, "swarm")
                self.handed.add(name)
                s.took(Kind.HANDBACK)
            elif not on and name in self.handed:
                store.drop_intent(name)
                self.handed.discard(name)
                self.disturbed = self.now

    def _workload(self) -> None:
        for p in self.swarm.spec.partitions:
            twin = self.swarm.blue.twins.get(p.name)
            if not isinstance(twin, SimSlurm):
                continue
            k = self.jobs[p.name]
            while k < len(p.jobs) and START_S + p.jobs[k][0] <= self.now:
                _, run_s, requeue = p.jobs[k]
                twin.submit_run(run_s, requeue)
                k += 1
            self.jobs[p.name] = k

    def paused(self, inst: Installation, slot: str) -> bool:
        """A replica stalled past its leases' TTL (a long GC pause, a frozen VM)."""
        return inst.name == BLUE and self.swarm.schedule.hit(Kind.LEASE_LOSS, slot) is not None

    def killed(self, inst: Installation, slot: str) -> None:
        inst.stop(slot)
        self.fenced = {k: v for k, v in self.fenced.items() if k[0] != slot}
        fault = self.swarm.schedule.active(Kind.KILL, slot)
        down_s = max(30.0, fault.duration_s if fault is not None else 30.0)
        self.restarts.append((self.now + down_s, inst, slot))
        self.disturbed = self.now

    # ------------------------------------------------------------ instant faults

    def _records(self) -> list[Instance]:
        store = self.swarm.blue.store
        return [i for p in self.swarm.blue.plans for i in store.instances(p)]

    def _notice(self, f: Fault) -> None:
        wanted = {
            "creating": (State.CREATING,),
            "active": (State.ACTIVE,),
            "ready": (State.READY,),
            "draining": (State.DRAINING,),
            "noticed-sooner": (State.NOTICED, State.DRAINING),
            "noticed-later": (State.NOTICED, State.DRAINING),
        }[f.target]
        records = [i for i in self._records() if i.server_id and i.state in HAS_SERVER]
        fit = [i for i in records if i.state in wanted]
        if f.target.startswith("noticed"):
            fit = [i for i in fit if i.notice_deadline is not None]
        pick = fit or records
        if not pick:
            return
        inst = pick[self.rng.randrange(len(pick))]
        deadline = self.now + f.value
        if f.target == "noticed-sooner" and inst.notice_deadline is not None:
            deadline = max(self.now, inst.notice_deadline - f.value / 2)
        elif f.target == "noticed-later" and inst.notice_deadline is not None:
            deadline = inst.notice_deadline + f.value
        assert inst.server_id is not None
        try:
            self.swarm.region.give_notice(inst.server_id, deadline)
        except Exception as e:  # gone meanwhile
            self.swarm.notes.append(f"notice to {inst.server_id} not given: {e}")
        else:
            self.swarm.schedule.took(Kind.NOTICE)

    def _mistype(self, f: Fault) -> None:
        """Someone sets a server's notice by hand, and mistypes it."""
        fit = [
            i.server_id
            for i in self._records()
            if i.server_id and i.state in HAS_SERVER and i.notice_deadline is None
        ]
        if fit:
            self.swarm.typos.write(fit[self.rng.randrange(len(fit))], f.target)
            self.swarm.schedule.took(Kind.NOTICE_MALFORMED)

    def _reclaim(self, f: Fault) -> None:
        region = self.swarm.region
        reclaimer = Reclaimer(region, self.swarm.clock, self.swarm.blue.store)
        flavor = region.pools()[0].flavor
        before = _standing(region.all_servers())
        try:
            reclaimer.request(f.target, flavor, int(f.value), 120.0, Budget(max_fraction=0.5))
        except ValueError as e:  # no spot pool in that hall
            self.swarm.notes.append(f"reclaim in {f.target}: {e}")
        after = _standing(region.all_servers())
        given = sum(n for _, n in after.values()) - sum(n for _, n in before.values())
        if given > 0:
            self.swarm.schedule.took(Kind.RECLAIM)
        for partition, (held, noticed) in sorted(after.items()):
            was = before.get(partition, (held, 0))[1]
            room = max(was, budget_room(held, 0.5))
            self.swarm.breaches.look("reclaimer_within_budget", noticed > room,
                                     f"{partition}: {noticed} of {held} servers under notice "
                                     f"(budget {room})")  # fmt: skip

    def _forget(self, f: Fault) -> None:
        twin = self.swarm.blue.twins.get(f.target)
        if isinstance(twin, SimSlurm) and twin.nodes_by_name:
            names = sorted(twin.nodes_by_name)
            twin.forget(names[self.rng.randrange(len(names))])
            self.swarm.schedule.took(Kind.SCHEDULER_FORGETS)

    def _token_reset(self, f: Fault) -> None:
        blue = self.swarm.blue
        self.swarm.schedule.took(Kind.TOKEN_RESET)
        if blue.lease_kind == "kubernetes":
            blue.kube_leases.recreate(f.target)
            return
        # Leases move from the database to Kubernetes (the chart's default): a rolling
        # upgrade, one replica now and the next a while later; both kinds run between.
        blue.lease_kind = "kubernetes"
        slots = sorted(blue.replicas)
        for k, slot in enumerate(slots):
            self.rolling.append((self.now + k * ROLLING_STEP_S, slot))
        self.mixed_until = self.now + (len(slots) - 1) * ROLLING_STEP_S + LEASE_TTL_S

    # ------------------------------------------------------------ a takeover mid-cycle

    def takeover(self, victim: str, partition: str) -> None:
        blue = self.swarm.blue
        r = blue.replicas.get(victim)
        others = [o for s, o in sorted(blue.replicas.items()) if s != victim]
        if r is None or not others or partition not in r.runner.held:
            return
        self.swarm.schedule.took(Kind.TAKEOVER_MID_CYCLE)
        other = others[0]
        # The victim stalls past its TTL: its heartbeat lapses, its lease expires.
        self.swarm.slow(LEASE_TTL_S + 1.0)
        if blue.lease_kind == "database":
            blue.lapse(r.name)
        else:
            blue.kube_leases.expire(r.name, self.now)
            blue.kube_leases.forget_replica(r.name)
        self.disturbed = self.now
        self.swarm.guard(blue, other, other.runner.tend_leases)
        if partition in other.runner.controllers:
            self.swarm.cycle(blue, other, partition)

    # ------------------------------------------------------------ checks of the whole world

    def dry_run(self) -> None:
        """`sco run --dry-run`'s round against the world: it must change nothing."""
        blue = self.swarm.blue
        before = self._fingerprint()
        if blue.url is None:
            scratch: MemoryFleetStore | SqlFleetStore = MemoryFleetStore()
        else:
            scratch = SqlFleetStore(
                fresh_state(blue.folder / "dry-run.sqlite"), run_migrations=False
            )
        try:
            demand, planes = blue._schedulers(blue.tenant.list, _Wall(self))
            ports = Ports(
                provider=blue.tenant,
                nodes=NodeRouter(planes, blue.tenant),
                demand=demand,
                state=FleetState.of(scratch),
                clock=self.swarm.clock,
            )
            dry = builder.dry_run(ports, FleetState.of(scratch), ScoPolicy, ControllerConfig())
            # One partition after another, not the round's threads: a seed must replay.
            for controller in dry.runner.controllers:
                try:
                    controller.cycle()
                except Exception as e:
                    self.swarm.notes.append(f"dry run of {controller.partition.name}: {e}")
        finally:
            scratch.close()
        after = self._fingerprint()
        if after != before:
            changed = [k for k, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            self.swarm.ledger.violate(
                "dry_run_changes_nothing", self.now, f"parts {changed} of the world changed"
            )
        self.swarm.ledger.checked["dry_run_changes_nothing"] += 1

    def _fingerprint(self) -> tuple[object, ...]:
        blue = self.swarm.blue
        region = tuple(
            (v.server_id, v.status, v.notice_deadline, self.swarm.region.is_draining(v.server_id))
            for v in self.swarm.region.all_servers()
        )
        counts = blue.store.counts()
        twins = tuple(twin.fingerprint() for twin in blue.twins.values())
        return (region, self.swarm.region.server_count(), twins, counts, blue.store.outbox_size())

    def floor(self, partition: str, records: Sequence[Instance]) -> None:
        """Below the floor long after the world last moved, with guaranteed room for
        the gap and nothing reported: the floor was not kept."""
        plan = self.swarm.blue.plans[partition]
        ready = sum(i.units for i in records if i.state is State.READY)
        ledger = self.swarm.ledger
        if partition in self.handed or ready >= plan.floor:
            self.short_since.pop(partition, None)
            return
        since = self.short_since.setdefault(partition, self.now)
        # The world did not allow it (no guaranteed room), or sco said so: the clock
        # starts again from here.
        region = self.swarm.region
        guaranteed = [p.id for p in region.pools() if not p.is_spot]
        room = sum(region.headroom(guaranteed).values())
        latest = self.swarm.blue.store.latest_plan(partition)
        notes = latest.notes if latest is not None else ()
        excused = ""
        if room < plan.floor - ready:
            excused = "floor: no guaranteed room"
        elif any("floor at risk" in n or "floor needs" in n for n in notes):
            excused = "floor: reported at risk"
        if excused:
            self.short_since[partition] = self.now
            ledger.misses[excused] += 1
            return
        ledger.checked["floor_holds"] += 1
        if self.now - max(since, self.disturbed) < FLOOR_GRACE_S:
            return
        ledger.violate(
            "floor_holds",
            self.now,
            f"{partition}: {ready} ready of floor {plan.floor} since "
            f"{since - START_S:.0f}s with {room} guaranteed room",
        )


class _Wall:
    """The dry run's clock: the world's, unskewed."""

    def __init__(self, adversary: Adversary) -> None:
        self.adversary = adversary

    def now(self) -> float:
        return self.adversary.now


def _standing(servers: Iterable[ServerView]) -> dict[str, tuple[int, int]]:
    """partition -> (servers it holds, of them under notice)."""
    out: dict[str, tuple[int, int]] = {}
    for v in servers:
        held, noticed = out.get(v.partition, (0, 0))
        out[v.partition] = (held + 1, noticed + (v.notice_deadline is not None))
    return out
