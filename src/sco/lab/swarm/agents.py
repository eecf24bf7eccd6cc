"""Node tokens and agents in the swarm: the cloud's metadata that hands a server its
token (and may refuse), the token ledger as a replica reaches it, and, per
installation, the contract distributor's copy (`sco.engine.distributor.ChangeFeed`,
on the swarm's clock) with an agent on every server that holds a token, asking for
its contract at every step as `sco agent` does.

What the checks read is the world's: which token each server was last handed, and
when, and what the distributor answered it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from sco.domain.contracts import AckStatus, StoredContract, token_digest
from sco.engine.distributor import ChangeFeed
from sco.lab.region import SimRegion
from sco.lab.swarm.faults import DatabaseDown, Stage, StoreFaults
from sco.lab.swarm.spec import Kind
from sco.ports import ContractFeed, FencedOut, ProviderError, Secret, TokenLedger
from sco.ports.contracts import ContractsUnavailable, Listener

TOKEN_TTL_S = 1200.0  # renewed at half its life: a world sees several renewals
# A refusal counts against sco while the node's token is younger than its life less
# this (the issuer's clock may run a little off the world's).
MARGIN_S = 60.0


class Agents:
    """One installation's distributor and the agents of its servers."""

    def __init__(self, contracts: ContractFeed, stage: Stage, now: Callable[[], float]) -> None:
        self.stage = stage
        self.now = now
        self.feed = ChangeFeed(FeedFaults(contracts, stage), poll_s=10.0, clock=now)
        self.loop = asyncio.new_event_loop()
        self.held: dict[str, tuple[str, float]] = {}  # server -> (its token's digest, when)

    def ask(self, servers: Iterable[str]) -> tuple[int, list[tuple[str, str]]]:
        """The distributor catches up, then every server holding a token asks for its
        contract; returns how many asked, and (server, why) of each refused while its
        token is young."""
        try:
            self.loop.run_until_complete(self.feed.refresh())
        except ContractsUnavailable:
            self.feed.loaded = self.feed.healthy = False  # as its loop does: read all again
        now = self.now()
        refused: list[tuple[str, str]] = []
        asked = 0
        for sid in servers:
            if sid not in self.held:
                continue
            asked += 1
            digest, at = self.held[sid]
            try:
                row = self.loop.run_until_complete(self.feed.find(digest, now, lambda: True))
            except ContractsUnavailable:
                continue  # a 503: the agent keeps its contract and asks again
            young = now - at < TOKEN_TTL_S - MARGIN_S
            if young and (row is None or row.server_id != sid):
                whose = "refused" if row is None else f"served {row.server_id}'s contract"
                refused.append((sid, f"{whose}, its token handed over {now - at:.0f} s ago"))
        return asked, refused

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


class Courier:
    """The server's metadata, through which a replica hands it its token."""

    def __init__(self, region: SimRegion, stage: Stage, agents: Agents) -> None:
        self.region = region
        self.stage = stage
        self.agents = agents

    def deliver_token(self, server_id: str, token: Secret) -> None:
        if self.stage.schedule.hit(Kind.TOKEN_DELIVERY_DOWN):
            raise ProviderError("set metadata: 503 from Nova (token not delivered)")
        self.region.deliver_token(server_id, token)
        self.agents.held[server_id] = (token_digest(token.reveal()), self.stage.now())


class LedgerFaults:
    """The token ledger as one replica reaches it: fleet state's outage reaches it, the
    replica may die before any of its writes, and a refused fence is told as any
    other write's."""

    def __init__(
        self, inner: TokenLedger, store: StoreFaults, partition: Callable[[], str]
    ) -> None:
        self.inner = inner
        self.store = store  # the replica's fleet state: its outages, and its death
        self.stage = store.stage
        self.partition = partition  # the partition whose cycle runs now

    def _reach(self) -> None:
        if self.stage.schedule.hit(Kind.DATABASE_DOWN):
            raise DatabaseDown("could not connect to the database")

    def untokened(
        self, partition: str, renew_before: float, undelivered_before: float
    ) -> list[tuple[str, str]]:
        self._reach()
        return self.inner.untokened(partition, renew_before, undelivered_before)

    def set_token(
        self, instance_id: str, token_hash: str, expires_at: float, now: float, fence: int = 0
    ) -> bool:
        self._reach()
        self.store.before_write()
        try:
            return self.inner.set_token(instance_id, token_hash, expires_at, now, fence)
        except FencedOut:
            self.stage.refused_write(self.store.replica, self.partition())
            raise

    def token_delivered(self, instance_id: str, token_hash: str) -> None:
        self._reach()
        self.store.before_write()
        self.inner.token_delivered(instance_id, token_hash)


class FeedFaults:
    """Fleet state as the distributor reads it: away while the seed says."""

    def __init__(self, inner: ContractFeed, stage: Stage) -> None:
        self.inner = inner
        self.stage = stage

    def _reach(self) -> None:
        if self.stage.schedule.hit(Kind.DISTRIBUTOR_DOWN):
            raise ContractsUnavailable("fleet state: the distributor cannot reach it")

    def get(self, instance_id: str) -> StoredContract | None:
        self._reach()
        return self.inner.get(instance_id)

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, StoredContract]:
        self._reach()
        return self.inner.get_many(instance_ids)

    def by_token(self, token_hash: str, now: float) -> StoredContract | None:
        self._reach()
        return self.inner.by_token(token_hash, now)

    def of_partition(self, partition: str) -> list[StoredContract]:
        self._reach()
        return self.inner.of_partition(partition)

    def current(self, gone_since: float) -> list[StoredContract]:
        self._reach()
        return self.inner.current(gone_since)

    def last_change(self) -> int:
        self._reach()
        return self.inner.last_change()

    def changed_since(self, after: int, limit: int = 50_000) -> tuple[int, set[str]]:
        self._reach()
        return self.inner.changed_since(after, limit)

    def prune_changes(self, before: float) -> int:
        self._reach()
        return self.inner.prune_changes(before)

    def ack(
        self, instance_id: str, version: int, status: AckStatus, detail: str, at: float
    ) -> bool:
        self._reach()
        return self.inner.ack(instance_id, version, status, detail, at)

    def listener(self) -> Listener | None:
        return None
