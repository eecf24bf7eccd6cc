"""Headroom from Placement: one `GET /allocation_candidates` per distinct request.

Each answer's provider summaries carry every candidate provider's capacity
and usage (microversion 1.27+), so one call tells how many servers of a
flavor fit in an aggregate, however many providers it has. Pools that share
a flavor request and an aggregate share the call.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.resources import ResourceRequest, headroom_from_summaries

# Nova's scheduler always forbids disabled computes; headroom must too.
NOVA_FORBIDS = frozenset({"COMPUTE_STATUS_DISABLED"})


@dataclass(frozen=True, slots=True)
class Want:
    """A pool's question to Placement: servers of `request` in aggregate `member_of`."""

    key: Hashable  # the pool id, usually
    request: ResourceRequest
    member_of: str | None


def as_nova_schedules(request: ResourceRequest) -> ResourceRequest:
    return ResourceRequest(request.resources, request.required, request.forbidden | NOVA_FORBIDS)


def headroom(client: CloudClient, wants: Sequence[Want]) -> tuple[dict[Hashable, int], int]:
    """Servers that fit now, per want key; and how many calls it took."""
    groups: dict[tuple[tuple[str, str], ...], list[Want]] = {}
    for w in wants:
        query = w.request.query(member_of=w.member_of)
        groups.setdefault(tuple(sorted(query.items())), []).append(w)
    rooms: dict[Hashable, int] = {}
    for query_items, members in groups.items():
        answer = client.get("placement", "/allocation_candidates", dict(query_items))
        summaries: Mapping[str, Mapping[str, object]] = (answer or {}).get("provider_summaries", {})
        room = headroom_from_summaries(summaries, members[0].request)
        for w in members:
            rooms[w.key] = room
    return rooms, len(groups)
