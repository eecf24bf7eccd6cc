"""The simulated region's two sides other than the provider's: the scheduler's side
of each node (joined, told to leave, drained, the token its agent is given) and
the reclaimer's (every server, and the notice it is given). Each works on the
region's `ServerTable` and `Timeline`, and is told the time and the settings it
needs by the region, which holds them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sco.lab.region_model import Kind, Server, SimObserver
from sco.lab.region_servers import ServerTable, Timeline
from sco.ports import NodeView, RetryableProviderError, Secret, ServerView


class NodeSide:
    """The scheduler's side of each node: its view, its drain, its agent's token."""

    def __init__(self, table: ServerTable, timeline: Timeline) -> None:
        self._table = table
        self._timeline = timeline
        self.reclaims_told: dict[str, float] = {}  # server -> when its node first was

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """Kept on the server for its simulated agent (`node_token`)."""
        s = self._table.get(server_id)
        if s is None:
            raise RetryableProviderError(f"no server {server_id}")
        self._set_token(s, token)

    def lose_token(self, server_id: str) -> None:
        """Another write to the server's metadata took its token (Nova writes a
        server's metadata whole)."""
        s = self._table.get(server_id)
        if s is not None:
            self._set_token(s, None)

    def _set_token(self, s: Server, token: Secret | None) -> None:
        listed_anew = (s.token is None) is not (token is None)  # the listing shows which
        s.token = token
        if listed_anew:
            self._table.relist(s)

    def node_token(self, server_id: str) -> Secret | None:
        s = self._table.get(server_id)
        return None if s is None else s.token

    def nodes(self, partition: str, installation: str) -> Mapping[str, NodeView]:
        return dict(self._table.nodes(partition, installation))

    def drain(
        self,
        partition: str,
        server_id: str,
        drain_by: float,
        reason: str,
        now: float,
        drain_s: float,
    ) -> None:
        """The node starts leaving in time to be out by `drain_by` (a drain takes
        `drain_s`), serving until then; told again with a sooner deadline, it leaves by
        that one."""
        s = self._table.get(server_id)
        if s is None or s.partition != partition:
            return
        sooner = s.drain_by is None or drain_by < s.drain_by
        if s.draining and not sooner and not (reason == "reclaim_notice" and s.reclaim_by is None):
            return
        s.draining = True
        s.drain_by = drain_by if sooner else s.drain_by
        if reason == "reclaim_notice":
            s.reclaim_by = drain_by
            self.reclaims_told.setdefault(server_id, now)
        if not s.joined or s.drained:
            s.drained = True
            self._table.renode(s)
            return
        self._table.renode(s)
        if not sooner:
            return
        start = max(now, drain_by - drain_s)
        self._timeline.push(start, Kind.DRAIN_START, server_id)
        self._timeline.push(start + drain_s, Kind.DRAINED, server_id)

    def is_draining(self, server_id: str) -> bool:
        """Whether the server's node was told to leave."""
        s = self._table.get(server_id)
        return s is not None and s.draining

    def reclaim_told_at(self, server_id: str) -> float | None:
        """When the server's node was first told to leave for a reclaim (kept after the
        server is gone)."""
        return self.reclaims_told.get(server_id)


class ReclaimerSide:
    """The reclaimer's side: every server, and the notice one is given."""

    def __init__(self, table: ServerTable, timeline: Timeline) -> None:
        self._table = table
        self._timeline = timeline

    def all_servers(self) -> Sequence[ServerView]:
        """Every listed server, of every partition (what a reclaimer chooses from)."""
        return self._table.all_listed()

    def give_notice(
        self, server_id: str, deadline: float, now: float, observer: SimObserver | None
    ) -> float:
        """The reclaim-notice contract: the server goes at `deadline`, or at the sooner
        deadline it was given before; returns the deadline in force. A first notice is
        told to `observer`."""
        s = self._table.get(server_id)
        if s is None:
            raise RetryableProviderError(f"no server {server_id}")
        deadline = max(deadline, now)
        if s.notice_deadline is not None and s.notice_deadline <= deadline:
            return s.notice_deadline
        if s.notice_deadline is None and observer:
            observer.reclaimed(
                now, s.partition, s.pool.id, s.pool.units_per_instance, deadline - now
            )
        s.notice_deadline = deadline
        self._table.relist(s)
        self._timeline.push(deadline, Kind.RECLAIM, server_id)
        return deadline
