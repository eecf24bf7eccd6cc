"""Partitions of different kinds in one process: each partition's demand and node plane
come from its own adapter, as a router picks them (never one global node plane)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sco.domain.demand import Demand, Partition
from sco.ports import DemandSource, NodeView, SchedulerCluster, ServerView


class DemandRouter:
    """`sco.ports.DemandSource` over several sources, each owning some partitions;
    `order` keeps the configuration's order of partitions."""

    def __init__(self, sources: Sequence[DemandSource], order: Sequence[str] = ()) -> None:
        self._owner: dict[str, DemandSource] = {}
        self._partitions: dict[str, Partition] = {}
        for source in sources:
            for p in source.partitions():
                if p.name in self._owner:
                    raise ValueError(f"partition {p.name!r} has two demand sources")
                self._owner[p.name] = source
                self._partitions[p.name] = p
        rank = {name: k for k, name in enumerate(order)}
        self._order = sorted(self._partitions, key=lambda n: (rank.get(n, len(rank)), n))
        self.sources = list(sources)

    def partitions(self) -> Sequence[Partition]:
        return [self._partitions[n] for n in self._order]

    def demand(self, partition: str, now: float) -> Demand:
        return self._owner[partition].demand(partition, now)

    def next_change_after(self, now: float) -> float | None:
        times = [t for s in self.sources if (t := s.next_change_after(now)) is not None]
        return min(times) if times else None


class NodeRouter:
    """`sco.ports.SchedulerCluster` per partition: its scheduler's, or `default`."""

    def __init__(self, planes: Mapping[str, SchedulerCluster], default: SchedulerCluster) -> None:
        self.planes = dict(planes)
        self.default = default

    def _plane(self, partition: str) -> SchedulerCluster:
        return self.planes.get(partition, self.default)

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return self._plane(partition).nodes(partition)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        self._plane(partition).tend(partition, servers)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        self._plane(partition).drain(partition, server_id, drain_by, reason)
