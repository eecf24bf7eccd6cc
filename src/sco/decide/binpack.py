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
        return (
            self.cpus <= room.cpus + 1e-9
            and self.memory_mb <= room.memory_mb + 1e-9
            and all(n <= room.gres.get(g, 0) for g, n in self.gres.items())
        )

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
    nodes already there (`free`, one entry per node).

    First fit, made quick for work of a few shapes (a deployment's replicas are
    alike): a slice does not fit where an equal slice before it did not (room only
    shrinks), so each shape resumes its search where the last of its kind went.
    Thousands of slices over thousands of nodes take a fraction of a second."""
    order = sorted(slices, key=_decreasing, reverse=True)
    bins: list[Size] = list(free)
    existing = len(bins)
    used: set[int] = set()
    unfit: list[Size] = []
    resume: dict[Size, int] = {}  # a shape's first bin that may still hold it
    for s in order:
        if not s.fits(shape):
            unfit.append(s)
            continue
        k = resume.get(s, 0)
        while k < len(bins) and not s.fits(bins[k]):
            k += 1
        if k == len(bins):
            bins.append(shape)
        bins[k] = bins[k].less(s)
        used.add(k)
        resume[s] = k
    return Packing(
        len(bins) - existing,
        tuple(sorted(k for k in used if k < existing)),
        tuple(unfit),
        tuple(bins[:existing]),
    )
