"""How many nodes of one shape a set of work needs: first-fit decreasing.

Scheduler adapters turn what their scheduler wants (Slurm's pending jobs,
Kubernetes' unschedulable pods) into per-node slices, and ask here how many
nodes of the partition's shape those need, after what fits in the free room
of nodes that are already there. First-fit decreasing, as Cluster
Autoscaler's estimator does: within 11/9 of the optimum plus one, and what
an operator can reproduce by hand. A slice no node of the shape could ever
hold is returned, to be reported, never counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, eq=False)
class Size:
    """Room on one node, or what one slice of work takes of it."""

    cpus: float = 0.0
    memory_mb: float = 0.0
    gres: Mapping[str, int] = field(default_factory=dict)  # e.g. {"gpu": 1}

    def _key(self) -> tuple[float, float, tuple[tuple[str, int], ...]]:
        return (self.cpus, self.memory_mb, tuple(sorted(self.gres.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Size) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def fits(self, room: Size) -> bool:
        if self.cpus > room.cpus + 1e-9 or self.memory_mb > room.memory_mb + 1e-9:
            return False
        # Most work asks no GRES: no generator for it (this runs per slice, per bin).
        return not self.gres or all(n <= room.gres.get(g, 0) for g, n in self.gres.items())

    def less(self, used: Size) -> Size:
        return Size(
            self.cpus - used.cpus,
            self.memory_mb - used.memory_mb,
            {g: n - used.gres.get(g, 0) for g, n in self.gres.items()},
        )


def _decreasing(s: Size) -> tuple[float, float, int]:
    return (s.cpus, s.memory_mb, sum(s.gres.values()))


@dataclass(frozen=True, slots=True)
class Packing:
    new_nodes: int  # nodes of the shape to add
    used_free: tuple[int, ...]  # which of the nodes already there took some of the work
    unfit: tuple[Size, ...]  # slices no node of the shape can hold
    free_after: tuple[Size, ...] = ()  # the room left on the nodes already there


def pack(slices: Sequence[Size], shape: Size, free: Sequence[Size] = ()) -> Packing:
    """Nodes of `shape` to add so every slice has a place, after the free room of the
    nodes already there (`free`, one entry per node)."""
    order = sorted(slices, key=_decreasing, reverse=True)
    runs: list[tuple[Size, int]] = []
    for s in order:  # equal slices side by side are one run
        if runs and (runs[-1][0] is s or runs[-1][0] == s):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return _first_fit(runs, shape, free)


def pack_runs(runs: Sequence[tuple[Size, int]], shape: Size, free: Sequence[Size] = ()) -> Packing:
    """`pack` of each run's size repeated its count of times, runs in their order (a
    job's slices are alike): the same packing, without a slice per node of every job.
    The sort is stable, so the slices come in the order `pack` would put them."""
    return _first_fit(sorted(runs, key=lambda r: _decreasing(r[0]), reverse=True), shape, free)


def _first_fit(runs: Sequence[tuple[Size, int]], shape: Size, free: Sequence[Size]) -> Packing:
    """First fit over runs of equal slices, in order. Made quick for work of a few
    shapes: a slice does not fit where an equal slice before it did not (room only
    shrinks), so each shape resumes its search where the last of its kind went; and
    a run's slices that go to new nodes fill them alike, so a full one is worked out
    once. Thousands of jobs over thousands of nodes take a fraction of a second."""
    bins: list[Size] = list(free)
    existing = len(bins)
    used: set[int] = set()
    unfit: list[Size] = []
    resume: dict[Size, int] = {}  # a shape's first bin that may still hold it
    for s, count in runs:
        if count <= 0:
            continue
        if not s.fits(shape):
            unfit.extend([s] * count)
            continue
        m = count  # still to place
        k = resume.get(s, 0)
        while k < len(bins):
            room = bins[k]
            if s.fits(room):
                room, m = room.less(s), m - 1
                while m and s.fits(room):
                    room, m = room.less(s), m - 1
                bins[k] = room
                if k < existing:
                    used.add(k)
                if not m:
                    break
            k += 1
        if m:
            _new_nodes(bins, s, m, shape)
            k = len(bins) - 1
        resume[s] = k
    return Packing(
        len(bins) - existing,
        tuple(sorted(used)),
        tuple(unfit),
        tuple(bins[:existing]),
    )


def _new_nodes(bins: list[Size], s: Size, m: int, shape: Size) -> None:
    """Add the new nodes `m` slices `s` fill, in first-fit order: full ones alike,
    then the last with what is left."""
    placed, room = _fill(shape, s, m)
    if placed == m:
        bins.append(room)
        return
    whole, rest = divmod(m, placed)
    bins.extend([room] * whole)
    if rest:
        bins.append(_fill(shape, s, rest)[1])


def _fill(shape: Size, s: Size, m: int) -> tuple[int, Size]:
    """How many of `m` slices `s` one new node takes, and the room they leave."""
    room, placed = shape, 0
    while placed < m and s.fits(room):
        room, placed = room.less(s), placed + 1
    return placed, room
