"""Notices that are not a time: someone sets a server's `sco:reclaim-at` by hand and
mistypes it. The swarm lists such a server as the OpenStack adapter reads it from
Nova's answer (`sco.adapters.openstack.resources`), so the rule that such a value is
no notice is held where it lives; the promise is that sco leaves the server alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime

from sco.adapters.openstack.resources import (
    META_GENERATION,
    META_PARTITION,
    META_POOL,
    META_RECLAIM_AT,
    META_REQUEST,
    server_views,
)
from sco.lab.swarm.promises import Breaches
from sco.ports import ServerStatus, ServerView

_NOVA = {ServerStatus.BUILD: "BUILD", ServerStatus.ACTIVE: "ACTIVE", ServerStatus.ERROR: "ERROR"}


class Typos:
    """Servers whose `sco:reclaim-at` holds a value that is not a time, until a real
    notice replaces it."""

    def __init__(self, breaches: Breaches) -> None:
        self.breaches = breaches
        self.values: dict[str, str] = {}  # server -> what was written

    def write(self, server_id: str, value: str) -> None:
        self.values[server_id] = value

    def listed(self, views: Iterable[ServerView]) -> tuple[ServerView, ...]:
        return tuple(self._read(v) for v in views)

    def _read(self, v: ServerView) -> ServerView:
        value = self.values.get(v.server_id)
        if value is None:
            return v
        if v.notice_deadline is not None:  # a reclaimer's notice overwrote the typo
            del self.values[v.server_id]
            return v
        (read,) = server_views([_nova(v, value)], v.partition).views
        return dataclasses.replace(
            v, notice_deadline=read.notice_deadline, notice_unreadable=read.notice_unreadable
        )

    def drained(self, server_id: str, reason: str) -> None:
        """sco told a node to leave: never for a notice that is not a time."""
        value = self.values.get(server_id)
        self.breaches.look(
            "unreadable_notice_is_none",
            value is not None and reason == "reclaim_notice",
            f"{server_id} drained for its sco:reclaim-at={value!r}",
        )


def _nova(v: ServerView, reclaim_at: str) -> dict[str, object]:
    """The server as `GET /servers/detail` answers, its notice mistyped."""
    return {
        "id": v.server_id,
        "status": _NOVA[v.status],
        "created": datetime.fromtimestamp(v.created_at, UTC).isoformat(),
        "metadata": {
            META_PARTITION: v.partition,
            META_POOL: v.pool,
            META_REQUEST: v.request_id,
            META_GENERATION: str(v.plan_generation),
            META_RECLAIM_AT: reclaim_at,
        },
    }
