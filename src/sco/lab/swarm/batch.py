"""Many seeds at once, each in a worker process, and what to do with a failing one:
replay it exactly, and shrink its schedule to the fewest faults that still fail.

Workers are started with a fixed `PYTHONHASHSEED` (`sco.lab.sweep`): the order in
which Python walks a set of strings must be the same in every process, or a seed
would not replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sco.adapters.kubernetes.connect import client_installed
from sco.engine.builder import Ports
from sco.lab.swarm.promises import INVARIANTS
from sco.lab.swarm.run import SeedResult, run_seed
from sco.lab.swarm.spec import ALL_KINDS, PORTS_OF, Fault, Kind, WorldSpec, world_of
from sco.lab.sweep import EVERY_CORE, Workers, sweep

BUNDLE = tuple(f.name for f in dataclasses.fields(Ports))  # the ports a runner is made of


@dataclass(frozen=True, slots=True)
class Trial:
    """One seed's world, with only the faults `keep` names (None: all of them)."""

    seed: int
    kinds: tuple[Kind, ...] = ALL_KINDS
    keep: tuple[int, ...] | None = None
    kube: bool = True
    state: str = "memory"  # fleet state: the in-memory twin, or "sqlite"

    def spec(self) -> WorldSpec:
        spec = world_of(self.seed, self.kinds, self.kube)
        if self.keep is None:
            return spec
        return spec.with_faults([spec.faults[k] for k in self.keep if k < len(spec.faults)])

    def command(self) -> str:
        """What replays it exactly."""
        parts = ["sco lab swarm", f"--seed {self.seed}"]
        if self.kinds != ALL_KINDS:
            parts.append(f"--faults {','.join(self.kinds)}")
        if self.keep is not None:
            parts.append(f"--keep {','.join(map(str, self.keep)) or 'none'}")
        if self.state != "memory":
            parts.append(f"--state {self.state}")
        return " ".join(parts)


def _run(trial: Trial) -> SeedResult:
    return run_seed(trial.spec(), trial.state)


def trials(
    seeds: int, first: int = 0, kinds: Sequence[Kind] = ALL_KINDS, state: str = "memory"
) -> list[Trial]:
    kube = client_installed()
    return [Trial(s, tuple(kinds), None, kube, state) for s in range(first, first + seeds)]


def run_trials(
    todo: Sequence[Trial], workers: Workers = EVERY_CORE
) -> Iterator[tuple[Trial, SeedResult]]:
    """Each trial's result in the order of the trials, each in a worker process with
    the sweep's hash seed (`sco.lab.sweep`); leaving the loop early cancels the rest."""
    where = dataclasses.replace(workers, isolated=True)
    yield from zip(todo, sweep(_run, todo, where), strict=False)


def replay(trial: Trial) -> SeedResult:
    """One trial, exactly as the swarm ran it (in a worker with the swarm's hash seed)."""
    ((_, result),) = list(run_trials([trial], Workers(1)))
    return result


def shrink(
    trial: Trial, result: SeedResult, say: Callable[[str], None] = lambda _m: None
) -> tuple[Trial, SeedResult]:
    """The fewest of the trial's faults that still break one of the invariants the
    whole schedule broke: each fault is taken away in turn and kept away while the
    failure stays (one pass per round, until a round takes none away)."""
    broken = {v.invariant for v in result.violations}
    keep = list(trial.keep if trial.keep is not None else range(len(trial.spec().faults)))
    best = result
    changed = True
    while changed and keep:
        changed = False
        for k in list(keep):
            candidate = dataclasses.replace(trial, keep=tuple(i for i in keep if i != k))
            got = replay(candidate)
            if broken & {v.invariant for v in got.violations}:
                keep.remove(k)
                best = got
                changed = True
                say(f"  without fault {k}: still fails ({len(keep)} faults left)")
    return dataclasses.replace(trial, keep=tuple(keep)), best


@dataclass
class Tally:
    """What a swarm run found, for its summary and its JSON line."""

    seeds: int = 0
    simulated_s: float = 0.0
    faults: int = 0
    cycles: int = 0
    violations: int = 0
    failing: list[tuple[Trial, SeedResult]] = dataclasses.field(default_factory=list)
    misses: dict[str, int] = dataclasses.field(default_factory=dict)
    checked: dict[str, int] = dataclasses.field(default_factory=dict)
    effective: dict[str, int] = dataclasses.field(default_factory=dict)  # kind -> effects
    state: str = "memory"

    def add(self, trial: Trial, result: SeedResult) -> None:
        self.seeds += 1
        self.state = result.state
        self.simulated_s += result.simulated_s
        self.faults += result.faults
        self.cycles += result.cycles
        self.violations += len(result.violations)
        if result.violations:
            self.failing.append((trial, result))
        for why, n in result.misses.items():
            self.misses[why] = self.misses.get(why, 0) + n
        for name, n in result.checked.items():
            self.checked[name] = self.checked.get(name, 0) + n
        for kind, n in result.effective.items():
            self.effective[kind] = self.effective.get(kind, 0) + n

    def ports_faulted(self) -> list[str]:
        """The ports of the builder's bundle a fault took effect at, in its order."""
        hit = {port for kind, n in self.effective.items() if n for port in PORTS_OF[Kind(kind)]}
        return [p for p in BUNDLE if p in hit]

    def line(self) -> dict[str, object]:
        return {
            "seeds": self.seeds,
            "state": self.state,
            "simulated_days": round(self.simulated_s / 86400.0, 2),
            "faults_injected": self.faults,
            "faults_effective": sum(self.effective.values()),
            "faults_effective_by_kind": dict(sorted(self.effective.items())),
            "ports_faulted": self.ports_faulted(),
            "ports_not_faulted": [p for p in BUNDLE if p not in self.ports_faulted()],
            "cycles": self.cycles,
            "invariant_violations": self.violations,
            "invariants": list(INVARIANTS),
            "checks": self.checked,
            "misses_by_cause": self.misses,
            "failing_seeds": [t.seed for t, _ in self.failing],
        }


def fault_names(faults: Sequence[Fault]) -> list[str]:
    return [f"{k}: {f.describe()}" for k, f in enumerate(faults)]
