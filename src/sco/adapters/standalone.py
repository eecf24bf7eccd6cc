"""Node planes for clusters sco does not talk to: each server is its node.

Without a Kubernetes or Slurm adapter, sco cannot see a node join. Both say a
node has joined once its server is ACTIVE, reading the provider's last listing
rather than listing again. They differ in how a node leaves:

- `ServersAsNodes`: a drain is over as soon as it is asked for, so a server sco
  removes is deleted on the next cycle (nothing runs on the node that sco knows of);
- `AgentNodes`: the node runs `sco agent`, which learns from its contract that it
  must leave, drains itself and acknowledges; the node counts as drained when it
  has (or, as for every node, when `drain_by` passes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from sco.ports import AckReader, NodeView, ServerStatus, ServerView


class ServersAsNodes:
    """`sco.ports.SchedulerCluster` where a node is its server."""

    def __init__(self, listing: Callable[[str], Sequence[ServerView]]) -> None:
        self._listing = listing
        self._drained: dict[str, set[str]] = {}  # per partition: one node plane serves all
        self._lock = threading.Lock()

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        with self._lock:
            drained = set(self._drained.get(partition, ()))
        views = self._listing(partition)
        live = {v.server_id for v in views}
        with self._lock:
            # Forget drained servers that are gone, keeping drains asked for meanwhile.
            mine = self._drained.get(partition, set())
            self._drained[partition] = {s for s in mine if s in live or s not in drained}
        return {
            v.server_id: NodeView(
                joined=v.status is ServerStatus.ACTIVE,
                drained=v.server_id in drained,
                joined_at=v.active_at,
                # Its order lives in this process: a restarted one is told again.
                leaving=v.server_id in drained,
                reclaim_by=None,
            )
            for v in views
        }

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """No scheduler to keep time for."""

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:  # noqa: ARG002
        with self._lock:
            self._drained.setdefault(partition, set()).add(server_id)


class AgentNodes:
    """`sco.ports.SchedulerCluster` whose nodes' agents say when they have drained."""

    def __init__(self, listing: Callable[[str], Sequence[ServerView]], acks: AckReader) -> None:
        self._listing = listing
        self._acks = acks

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        drained = self._acks.drained_servers(partition)
        return {
            v.server_id: NodeView(
                joined=v.status is ServerStatus.ACTIVE,
                drained=v.server_id in drained,
                joined_at=v.active_at,
            )
            for v in self._listing(partition)
        }

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """The agents keep time on their nodes, from their contracts."""

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        """Nothing to send: the transition to DRAINING changed the node's contract,
        which its agent is waiting on."""
