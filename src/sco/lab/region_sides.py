"""The simulated region as others see it: its servers and the order of what happens
to them, the scheduler's side of each node (joined, told to leave, drained) and the
reclaimer's (every server, and the notice it is given). `SimRegion` is the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar

from sco.domain.installation import DEFAULT_INSTALLATION, is_mine
from sco.domain.pools import Pool
from sco.ports import NodeView, RetryableProviderError, Secret, ServerStatus, ServerView

_V = TypeVar("_V", ServerView, NodeView)

if TYPE_CHECKING:  # the region that carries these sides
    from sco.lab.region import SimConfig, SimObserver


class Kind(IntEnum):
    # Lower runs first at equal times: servers leave before capacity is checked.
    RECLAIM = 0
    DELETED = 1
    CAPACITY = 2
    NOTICE = 3
    PRICE = 4
    LISTED = 5
    ACTIVE = 6
    JOINED = 7
    DRAIN_START = 8
    DRAINED = 9


@dataclass(slots=True)
class Server:
    server_id: str
    partition: str
    pool: Pool
    request_id: str
    plan_generation: int
    created_at: float
    listed: bool = False
    status: ServerStatus = ServerStatus.BUILD
    joined: bool = False
    running: bool = False
    draining: bool = False
    drained: bool = False
    installation: str = DEFAULT_INSTALLATION  # which sco made it (several may share a region)
    drain_by: float | None = None  # the deadline the node was told
    reclaim_by: float | None = None  # ... when told by a reclaim
    deleting: bool = False
    notice_deadline: float | None = None
    active_at: float | None = None
    joined_at: float | None = None


class RegionSides:
    """The scheduler's and the reclaimer's side of `SimRegion` (a mixin over its state)."""

    now: float
    config: SimConfig
    observer: SimObserver | None
    reclaims_told: dict[str, float]
    _servers: dict[str, Server]
    _tokens: dict[str, Secret]
    _listed: dict[str, dict[str, ServerView]]
    _node_views: dict[str, dict[str, NodeView]]
    _versions: dict[str, int]  # partition -> changes to its servers' views
    _views_kept: dict[tuple[str, str, str], tuple[int, dict[str, Any]]]

    def _push(self, t: float, kind: Kind, key: str) -> None:
        raise NotImplementedError

    def _relist(self, s: Server) -> None:
        raise NotImplementedError

    def _views_changed(self, partition: str) -> None:
        """A server of `partition` was listed, relisted, renoded or removed."""
        self._versions[partition] = self._versions.get(partition, 0) + 1

    def _kept(
        self, kind: str, partition: str, installation: str, views: Mapping[str, _V]
    ) -> dict[str, _V]:
        """`_mine` of `views`, kept until a server of the partition changes: the
        controllers read a partition's servers and nodes many times per cycle."""
        version = self._versions.get(partition, 0)
        kept = self._views_kept.get((kind, partition, installation))
        if kept is None or kept[0] != version:
            kept = (version, self._mine(views, installation))
            self._views_kept[(kind, partition, installation)] = kept
        return kept[1]

    def _renode(self, s: Server) -> None:
        self._views_changed(s.partition)
        self._node_views[s.partition][s.server_id] = NodeView(
            joined=s.joined,
            drained=s.drained,
            joined_at=s.joined_at,
            leaving=s.draining,
            reclaim_by=s.reclaim_by,
        )

    # ------------------------------------------------------------ SchedulerCluster

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """Kept for the simulated server's agent (`node_token`)."""
        if server_id not in self._servers:
            raise RetryableProviderError(f"no server {server_id}")
        self._tokens[server_id] = token

    def node_token(self, server_id: str) -> Secret | None:
        return self._tokens.get(server_id)

    def nodes(
        self, partition: str, installation: str = DEFAULT_INSTALLATION
    ) -> Mapping[str, NodeView]:
        views = self._node_views.get(partition, {})
        return dict(self._kept("nodes", partition, installation, views))

    def _mine(self, views: Mapping[str, _V], installation: str) -> dict[str, _V]:
        """Of `views` (by server id), those of `installation`'s servers."""
        servers = self._servers
        return {
            sid: v
            for sid, v in views.items()
            if sid in servers and is_mine(servers[sid].installation, installation)
        }

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """Nothing keeps time on a simulated node's side: its drain is scheduled."""

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """The node starts leaving in time to be out by `drain_by`, serving until then;
        told again with a sooner deadline, it leaves by that one."""
        s = self._servers.get(server_id)
        if s is None or s.partition != partition:
            return
        sooner = s.drain_by is None or drain_by < s.drain_by
        if s.draining and not sooner and not (reason == "reclaim_notice" and s.reclaim_by is None):
            return
        s.draining = True
        s.drain_by = drain_by if sooner else s.drain_by
        if reason == "reclaim_notice":
            s.reclaim_by = drain_by
            self.reclaims_told.setdefault(server_id, self.now)
        if not s.joined or s.drained:
            s.drained = True
            self._renode(s)
            return
        self._renode(s)
        if not sooner:
            return
        start = max(self.now, drain_by - self.config.drain_s)
        self._push(start, Kind.DRAIN_START, server_id)
        self._push(start + self.config.drain_s, Kind.DRAINED, server_id)

    # ------------------------------------------------------------ the reclaimer's side

    def all_servers(self) -> Sequence[ServerView]:
        """Every listed server, of every partition (what a reclaimer chooses from)."""
        return [v for views in self._listed.values() for v in views.values()]

    def give_notice(self, server_id: str, deadline: float) -> float:
        """The reclaim-notice contract: the server goes at `deadline`, or at the sooner
        deadline it was given before; returns the deadline in force."""
        s = self._servers.get(server_id)
        if s is None:
            raise RetryableProviderError(f"no server {server_id}")
        deadline = max(deadline, self.now)
        if s.notice_deadline is not None and s.notice_deadline <= deadline:
            return s.notice_deadline
        if s.notice_deadline is None and self.observer:
            self.observer.reclaimed(
                self.now, s.partition, s.pool.id, s.pool.units_per_instance, deadline - self.now
            )
        s.notice_deadline = deadline
        self._relist(s)
        self._push(deadline, Kind.RECLAIM, server_id)
        return deadline

    # ------------------------------------------------------------ what an onlooker asks

    def is_deleting(self, server_id: str) -> bool:
        """Whether a delete was sent for the server."""
        s = self._servers.get(server_id)
        return s is not None and s.deleting

    def is_draining(self, server_id: str) -> bool:
        """Whether the server's node was told to leave."""
        s = self._servers.get(server_id)
        return s is not None and s.draining

    def reclaim_told_at(self, server_id: str) -> float | None:
        """When the server's node was first told to leave for a reclaim (kept after the
        server is gone)."""
        return self.reclaims_told.get(server_id)
