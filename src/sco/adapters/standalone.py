"""A node plane for clusters sco does not talk to: each server is its node.

Without a Kubernetes or Slurm adapter, sco cannot see a node join or finish
draining. This one says a node has joined once its server is ACTIVE, and
that a drain is over as soon as it is asked for, so a server sco removes is
deleted on the next cycle. It reads the provider's last listing rather than
listing again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from sco.ports import NodeView, ServerStatus, ServerView


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
            )
            for v in views
        }

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:  # noqa: ARG002
        with self._lock:
            self._drained.setdefault(partition, set()).add(server_id)
