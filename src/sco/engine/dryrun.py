"""A provider that looks but does not touch: `sco run --dry-run`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sco.domain.pools import Pool, PoolId
from sco.domain.times import utc
from sco.ports import CreateResult, NodeView, Provider, SchedulerCluster, ServerView


@dataclass(frozen=True, slots=True)
class Intent:
    """Something the controller would have done."""

    action: str  # "create" or "delete"
    pool: PoolId
    count: int
    detail: str


@dataclass
class DryRunProvider:
    """Reads go to the real provider; creates and deletes are only written down."""

    inner: Provider
    intents: list[Intent] = field(default_factory=list)
    _pool_of: dict[str, PoolId] = field(default_factory=dict)

    def pools(self) -> Sequence[Pool]:
        return self.inner.pools()

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        return self.inner.headroom(pools)

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        return self.inner.prices(pools)

    def list(self, partition: str) -> Sequence[ServerView]:
        views = self.inner.list(partition)
        self._pool_of.update({v.server_id: v.pool for v in views})
        return views

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        detail = f"partition {partition}, plan {plan_generation}, request {request_id}"
        self.intents.append(Intent("create", pool, count, detail))
        return CreateResult((), "dry run")

    def delete(self, server_ids: Sequence[str]) -> None:
        for sid in server_ids:
            self.intents.append(Intent("delete", self._pool_of.get(sid, "?"), 1, f"server {sid}"))


@dataclass
class DryRunNodes:
    """Reads go to the real node plane; drains are only written down and the scheduler's
    own deadline work is not done (a dry run must not drain a real scheduler's node,
    requeue its jobs, take a node down or delete one)."""

    inner: SchedulerCluster
    intents: list[Intent]

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        return self.inner.nodes(partition)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """Left to the controllers that lead the partition."""

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        detail = f"partition {partition}, node of server {server_id}, by {utc(drain_by)}"
        self.intents.append(Intent("drain", reason or "-", 1, detail))
