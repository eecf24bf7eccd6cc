"""The simulated region's servers and the order of what happens to them: its timeline
of events (`Timeline`) and its servers with what `list` and `nodes` answer of them
(`ServerTable`). The region and both its sides hold the same two."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from typing import Any, TypeVar

from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import PoolId
from sco.lab.region_model import Kind, Server
from sco.ports import NodeView, ServerView

_V = TypeVar("_V", ServerView, NodeView)


class Timeline:
    """Events due on the region's clock: by time, then by kind (`Kind`'s order), then
    in the order they were scheduled."""

    def __init__(self) -> None:
        self._events: list[tuple[float, int, int, str]] = []
        self._seq = itertools.count()

    def push(self, t: float, kind: Kind, key: str) -> None:
        heapq.heappush(self._events, (t, int(kind), next(self._seq), key))

    def next_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    def pop_due(self, t: float) -> tuple[float, Kind, str] | None:
        """The first event due at or before `t`, taken off the timeline (None: none is)."""
        if not self._events or self._events[0][0] > t:
            return None
        at, kind, _, key = heapq.heappop(self._events)
        return at, Kind(kind), key


class ServerTable:
    """The region's servers by id and by pool, and their views as listed (`list`) and
    as nodes (`nodes`), rebuilt as each server changes: a cycle's listing costs a copy,
    not a view built per server."""

    def __init__(self) -> None:
        self._servers: dict[str, Server] = {}
        self._by_pool: dict[PoolId, dict[str, Server]] = {}  # a server leaves in O(1)
        # (partition, installation) -> id -> view: what `list` and `nodes` answer, kept
        # by installation as the servers change (not sorted out of all at every change)
        self._listed: dict[tuple[str, str], dict[str, ServerView]] = {}
        self._node_views: dict[tuple[str, str], dict[str, NodeView]] = {}
        # (kind, partition) -> changes to its servers' views of that kind (list, nodes)
        self._versions: dict[tuple[str, str], int] = {}
        self._views_kept: dict[tuple[str, str, str], tuple[int, dict[str, Any]]] = {}
        self._tuples: dict[tuple[str, str], tuple[int, tuple[ServerView, ...]]] = {}
        self.moves = 0  # servers added and removed: what a pool holds changed

    def add_pool(self, pool_id: PoolId) -> None:
        self._by_pool[pool_id] = {}

    def get(self, server_id: str) -> Server | None:
        return self._servers.get(server_id)

    def __contains__(self, server_id: str) -> bool:
        return server_id in self._servers

    def __len__(self) -> int:
        return len(self._servers)

    def holding(self, pool_id: PoolId) -> list[Server]:
        """The pool's servers, oldest first."""
        return list(self._by_pool[pool_id].values())

    def held_in(self, pool_id: PoolId) -> int:
        return len(self._by_pool[pool_id])

    def add(self, s: Server) -> None:
        """A new server: held in its pool, a node not yet joined, listed once `relist`
        finds it listed."""
        self._servers[s.server_id] = s
        self._by_pool[s.pool.id][s.server_id] = s
        self.moves += 1
        self._listed.setdefault(_whose(s), {})
        self._node_views.setdefault(_whose(s), {})
        self.renode(s)

    def remove(self, s: Server) -> None:
        """The server is gone, with its listing and its node."""
        del self._servers[s.server_id]
        del self._by_pool[s.pool.id][s.server_id]
        self.moves += 1
        self._listed[_whose(s)].pop(s.server_id, None)
        self._views_changed("list", s.partition)
        self._views_changed("nodes", s.partition)
        del self._node_views[_whose(s)][s.server_id]

    # ------------------------------------------------------------ views

    def relist(self, s: Server) -> None:
        """The server's listing changed: build its view again (once listed)."""
        if s.listed:
            self._views_changed("list", s.partition)
            self._listed[_whose(s)][s.server_id] = ServerView(
                server_id=s.server_id,
                partition=s.partition,
                pool=s.pool.id,
                request_id=s.request_id,
                plan_generation=s.plan_generation,
                status=s.status,
                created_at=s.created_at,
                notice_deadline=s.notice_deadline,
                active_at=s.active_at,
                token_missing=s.token is None,
            )

    def renode(self, s: Server) -> None:
        """The server's node changed: build its view again."""
        self._views_changed("nodes", s.partition)
        self._node_views[_whose(s)][s.server_id] = NodeView(
            joined=s.joined,
            drained=s.drained,
            joined_at=s.joined_at,
            leaving=s.draining,
            reclaim_by=s.reclaim_by,
        )

    def listing(self, partition: str, installation: str) -> Mapping[str, ServerView]:
        """The partition's listed servers of `installation`, by id (not to be changed)."""
        views = self._listed.get((partition, installation), {})
        return self._kept("list", partition, installation, views)

    def listed(self, partition: str, installation: str) -> tuple[ServerView, ...]:
        """`listing`'s views in order, the same tuple until a server of the partition
        changes: a caller can tell an unchanged listing by its identity, and cannot
        change it."""
        version = self._versions.get(("list", partition), 0)
        kept = self._tuples.get((partition, installation))
        if kept is None or kept[0] != version:
            kept = (version, tuple(self.listing(partition, installation).values()))
            self._tuples[(partition, installation)] = kept
        return kept[1]

    def nodes(self, partition: str, installation: str) -> Mapping[str, NodeView]:
        """The nodes of the partition's servers of `installation` (not to be changed)."""
        views = self._node_views.get((partition, installation), {})
        return self._kept("nodes", partition, installation, views)

    def all_listed(self) -> list[ServerView]:
        """Every listed server, of every partition and installation."""
        return [v for views in self._listed.values() for v in views.values()]

    def _views_changed(self, kind: str, partition: str) -> None:
        """What `kind` (list, nodes) says of a server of `partition` changed."""
        self._versions[(kind, partition)] = self._versions.get((kind, partition), 0) + 1

    def _kept(
        self, kind: str, partition: str, installation: str, views: Mapping[str, _V]
    ) -> dict[str, _V]:
        """A copy of `views`, kept until a server of the partition changes: the
        controllers read a partition's servers and nodes many times per cycle, and
        what they were given is never changed under them."""
        version = self._versions.get((kind, partition), 0)
        kept = self._views_kept.get((kind, partition, installation))
        if kept is None or kept[0] != version:
            kept = (version, dict(views))
            self._views_kept[(kind, partition, installation)] = kept
        return kept[1]


def _whose(s: Server) -> tuple[str, str]:
    """The partition and installation whose listing shows `s`."""
    return s.partition, s.installation or DEFAULT_INSTALLATION
