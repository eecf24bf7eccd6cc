"""The cloud operator's side of the reclaim-notice contract, as the reference
reclaimer (`sco reclaim`) sees it: every spot server and its notice, and what sco's
fleet state says of them (to choose by least harm)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sco.domain.pools import Pool
from sco.ports.provider import ServerView
from sco.ports.state import InstanceStore, PlanStore


class ReclaimCloud(Protocol):
    def pools(self) -> Sequence[Pool]: ...

    def all_servers(self) -> Sequence[ServerView]:
        """Every server of every installation in the reclaimer's projects."""
        ...

    def give_notice(self, server_id: str, deadline: float) -> float:
        """Set the notice unless one is set; returns the deadline in force. A notice
        set but unreadable is no deadline: a ProviderError, never a guess."""
        ...

    def delete(self, server_ids: Sequence[str]) -> None: ...


class ReclaimFleet(InstanceStore, PlanStore, Protocol):
    """What the reclaimer reads of fleet state to choose by least harm: which servers
    serve, and which partitions hold more than their plan."""
