"""`sco reclaim` from `sco.yaml`: the reference reclaimer (`sco.engine.reclaimer`) on the
configured cloud, with fleet state to spare serving nodes when one is named, and a
capacity trace replayed onto it (`sco.lab.reclaim_replay`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sco.assembly.controllers import scope_warning, start_openstack
from sco.assembly.settings import Settings
from sco.assembly.state import open_fleet
from sco.assembly.wiring import StartError, require
from sco.decide.reclaim import Budget
from sco.engine.clock import SystemClock
from sco.engine.reclaimer import Noticed, Reclaimer
from sco.lab.reclaim_replay import ReplayPool, replay

__all__ = [
    "Budget",
    "Cloud",
    "Noticed",
    "Plays",
    "Reclaimer",
    "operator_cloud",
    "replay_trace",
    "trace_pools",
]


@dataclass
class Cloud:
    """The reclaimer on the configured cloud, and what the cloud saw beside sco's."""

    reclaimer: Reclaimer
    warning: str  # one line when the credential could do more than needed, else ""
    foreign: Callable[[], dict[str, str]]  # servers of other projects (id: project)
    foreign_servers: Callable[[], Mapping[str, int]]  # ... counted by project
    now: Callable[[], float]


@contextmanager
def operator_cloud(settings: Settings, with_state: bool) -> Iterator[Cloud]:
    """The cloud as `provider` says (its credential need not create), and fleet state
    too when `with_state` (to choose by least harm)."""
    require(settings, "provider.cloud", "provider.region_file")
    provider = start_openstack(settings.provider, creates=False)
    store = open_fleet(settings, run_migrations=False) if with_state else None
    clock = SystemClock()
    try:
        yield Cloud(
            Reclaimer(provider, clock, store),
            scope_warning(provider),
            provider.foreign,
            provider.foreign_servers,
            clock.now,
        )
    finally:
        if store is not None:
            store.close()
        provider.stop()


@dataclass(frozen=True, slots=True)
class Plays:
    """A capacity trace's series, each on the spot pool it plays, and instances a unit."""

    pools: list[ReplayPool]
    pool_size: int


def trace_pools(folder: Path, maps: Sequence[str], pool_size: int | None) -> Plays:
    """The trace's series, each on the spot pool a `SERIES=HALL/FLAVOR` map names, and
    the pool size (StartError naming the option at fault)."""
    from sco.lab.traces import TraceError, load_traces

    try:
        traces = load_traces(folder)
    except (TraceError, OSError) as e:
        raise StartError(f"--trace: {e}") from None
    by_name = {s.name: s for s in traces.series}
    if not maps:
        raise StartError(f"--trace needs --map SERIES=HALL/FLAVOR (series: {', '.join(by_name)})")
    pools = []
    for m in maps:
        name, _, where = m.partition("=")
        hall, _, flavor = where.partition("/")
        if name not in by_name or not hall or not flavor:
            raise StartError(
                f"--map {m!r}: SERIES=HALL/FLAVOR with SERIES one of {', '.join(by_name)}"
            )
        pools.append(ReplayPool(by_name[name], hall, flavor))
    binary = all(p.series.binary for p in pools)
    size = pool_size if pool_size is not None else (traces.region.pool_size if binary else 1)
    if size < 1:
        raise StartError("--pool-size: at least 1")
    return Plays(pools, size)


def replay_trace(
    reclaimer: Reclaimer,
    plays: Plays,
    *,
    speed: float,
    notice_s: float,
    budget: Budget,
    stop: Callable[[], bool],
    sleep: Callable[[float], object],
    on_notice: Callable[[float, ReplayPool, Noticed], None],
) -> int:
    """Play the trace onto the cloud as reclaims with notice; returns servers noticed."""
    return replay(
        reclaimer, plays.pools, pool_size=plays.pool_size, speed=speed, notice_s=notice_s,
        budget=budget, stop=stop, sleep=sleep, on_notice=on_notice,
    )  # fmt: skip
