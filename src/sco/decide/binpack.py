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


@dataclass(frozen=True, slots=True)
class Size:
    """Room on one node, or what one slice of work takes of it."""

    cpus: float = 0.0
    memory_mb: float = 0.0
    gres: Mapping[str, int] = field(default_factory=dict)  # e.g. {"gpu": 1}

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


@dataclass(frozen=True, slots=True)
class Packing:
    new_nodes: int  # nodes of the shape to add
    used_free: tuple[int, ...]  # which of the nodes already there took some of the work
    unfit: tuple[Size, ...]  # slices no node of the shape can hold
    free_after: tuple[Size, ...] = ()  # the room left on the nodes already there


def pack(slices: Sequence[Size], shape: Size, free: Sequence[Size] = ()) -> Packing:
    """Nodes of `shape` to add so every slice has a place, after the free room of the
    nodes already there (`free`, one entry per node)."""
    order = sorted(slices, key=lambda s: (s.cpus, s.memory_mb, sum(s.gres.values())), reverse=True)
    bins: list[Size] = list(free)
    existing = len(bins)
    used: set[int] = set()
    unfit: list[Size] = []
    for s in order:
        if not s.fits(shape):
            unfit.append(s)
            continue
        for k, room in enumerate(bins):
            if s.fits(room):
                bins[k] = room.less(s)
                used.add(k)
                break
        else:
            bins.append(shape.less(s))
            used.add(len(bins) - 1)
    return Packing(
        len(bins) - existing,
        tuple(sorted(k for k in used if k < existing)),
        tuple(unfit),
        tuple(bins[:existing]),
    )
