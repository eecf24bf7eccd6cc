"""Headroom from Placement, in as few calls as the question allows.

One `GET /allocation_candidates` per distinct flavor request, without an
aggregate filter: its provider summaries carry every candidate provider's
capacity and usage (microversion 1.27+). Which providers belong to which
aggregate (hall) changes rarely, so that is read with one
`GET /resource_providers?member_of=` per aggregate and kept for
`membership_ttl_s`. A refresh therefore costs one call per flavor, however
many halls and providers there are.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from sco.adapters.openstack.answers import AllocationCandidates, ResourceProviders, read
from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.resources import ResourceRequest, headroom_from_summaries
from sco.ports import Clock

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


class PlacementHeadroom:
    """Headroom per want; keeps aggregate membership between refreshes."""

    def __init__(self, client: CloudClient, clock: Clock, membership_ttl_s: float = 600.0) -> None:
        self._client = client
        self._clock = clock
        self._ttl = membership_ttl_s
        self._members: dict[str, tuple[float, frozenset[str]]] = {}
        self.calls = 0  # Placement calls made by the last `rooms`

    def rooms(self, wants: Sequence[Want]) -> dict[Hashable, int]:
        self.calls = 0
        by_request: dict[tuple[tuple[str, str], ...], list[Want]] = {}
        for w in wants:
            by_request.setdefault(tuple(sorted(w.request.query().items())), []).append(w)
        out: dict[Hashable, int] = {}
        for query, members in by_request.items():
            request = members[0].request
            summaries = self._summaries(dict(query))
            for w in members:
                if w.member_of is None:
                    chosen = summaries
                else:
                    inside = self._membership(w.member_of)
                    chosen = {rp: s for rp, s in summaries.items() if rp in inside}
                out[w.key] = headroom_from_summaries(chosen, request)
        return out

    def _summaries(self, query: Mapping[str, str]) -> Mapping[str, Mapping[str, object]]:
        self.calls += 1
        answer = self._client.get("placement", "/allocation_candidates", query)
        found = read(AllocationCandidates, answer, "placement GET /allocation_candidates")
        return {rp: s.model_dump() for rp, s in found.provider_summaries.items()}

    def _membership(self, aggregate: str) -> frozenset[str]:
        now = self._clock.now()
        cached = self._members.get(aggregate)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        self.calls += 1
        answer = self._client.get("placement", "/resource_providers", {"member_of": aggregate})
        listed = read(ResourceProviders, answer, "placement GET /resource_providers")
        found = frozenset(rp.uuid for rp in listed.resource_providers)
        self._members[aggregate] = (now, found)
        return found

    def forget_membership(self) -> None:
        """Read aggregate membership again on the next refresh (a host moved halls)."""
        self._members.clear()
