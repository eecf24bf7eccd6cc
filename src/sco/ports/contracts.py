"""Node contracts and their tokens, by role: the controller issues tokens and reads
agents' acknowledgements; the distributor serves contracts and takes
acknowledgements; the operator revokes tokens. `Contracts` is all of them.

Contracts are written by fleet state itself, with the transitions that change
them (their version grows only when a node's terms change); none of these roles
writes a contract's terms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from sco.domain.contracts import AckStatus, StoredContract
from sco.ports.secrets import Secret

# Runs on a thread of its own until the event is set, calling back on every change.
Listener = Callable[[Callable[[], None], threading.Event], None]


class ContractsUnavailable(Exception):
    """Fleet state could not answer a read or record an acknowledgement: keep what is
    known (a node keeps its last contract) and try again later. The message says
    what failed, never a token or its digest."""


class TokenCourier(Protocol):
    """Hands a node its token through its server (metadata the node can read)."""

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """Raises ProviderError when the server could not be given it."""
        ...


class TokenLedger(Protocol):
    """Where node tokens are kept (as digests) with their contracts.

    A token is stored before it is delivered and marked delivered after: a node then
    never holds a token the ledger refuses, whichever leaders interleave (a stale
    leader cannot store one, and one it stored and delivers late is the replaced
    token, still accepted)."""

    def untokened(
        self, partition: str, renew_before: float, undelivered_before: float
    ) -> list[tuple[str, str]]:
        """(instance id, server id) of live contracts with a server and no token, one
        that expires before `renew_before`, or one stored before `undelivered_before`
        and not marked delivered (its issuer stopped in between)."""
        ...

    def set_token(
        self, instance_id: str, token_hash: str, expires_at: float, now: float, fence: int = 0
    ) -> bool:
        """Store a new token's digest before it is delivered; the token it replaces, and
        the one last marked delivered, stay accepted until their own expiry (`revoke`
        ends them all). False when there is no
        such contract or another writer set a token since; FencedOut when `fence` is
        below the partition's lease token."""
        ...

    def token_delivered(self, instance_id: str, token_hash: str) -> None:
        """The token with `token_hash` reached its server (nothing if it was replaced)."""
        ...


class TokenAdmin(Protocol):
    def revoke(self, partition: str, instance_id: str | None = None) -> int:
        """Drop tokens (all of a partition's, or one instance's): new ones are issued on
        the controller's next cycle, and the old ones stop working at once. Returns how
        many contracts lost theirs."""
        ...


class AckReader(Protocol):
    def drained_servers(self, partition: str) -> set[str]:
        """Servers whose agent said its node is out of its scheduler (drained or
        left), answering the contract version that told it to leave."""
        ...


class ContractFeed(Protocol):
    """What the distributor reads of contracts, and the acknowledgements it writes.
    Its reads and `ack` raise ContractsUnavailable when fleet state cannot answer."""

    def get(self, instance_id: str) -> StoredContract | None: ...

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, StoredContract]: ...

    def by_token(self, token_hash: str, now: float) -> StoredContract | None:
        """The contract whose token hashes to `token_hash`, if the token has not expired."""
        ...

    def of_partition(self, partition: str) -> list[StoredContract]: ...

    def current(self, gone_since: float) -> list[StoredContract]:
        """Every contract a node may still ask for: not gone, or gone since `gone_since`."""
        ...

    def last_change(self) -> int:
        """The id of the latest change (0: none yet)."""
        ...

    def changed_since(self, after: int, limit: int = 50_000) -> tuple[int, set[str]]:
        """(the latest change id, the instances whose contracts changed after `after`)."""
        ...

    def prune_changes(self, before: float) -> int:
        """Forget changes logged before `before` (wall time); returns how many."""
        ...

    def ack(
        self, instance_id: str, version: int, status: AckStatus, detail: str, at: float
    ) -> bool:
        """Record the agent's answer to `version`; False when that is not the current one."""
        ...

    def listener(self) -> Listener | None:
        """How to hear of changes as they commit, if the store can tell (PostgreSQL's
        NOTIFY); None: ask `changed_since` now and then."""
        ...


class Contracts(TokenLedger, TokenAdmin, AckReader, ContractFeed, Protocol):
    """Every role of the contracts in fleet state."""
