"""Contracts: what a node is told about itself.

A contract is the node's side of its instance record: where it belongs, in what
state, and by when it must leave. Its version (the ETag agents poll with) grows
only when what the node is told changes, not with every transition.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sco.domain.instances import Instance
from sco.domain.lifecycle import State


class NodeState(StrEnum):
    """What a node needs to know of its instance's lifecycle."""

    JOINING = "joining"  # its server is being created or has not joined yet
    SERVING = "serving"  # in its scheduler, taking work
    LEAVING = "leaving"  # must be out of its scheduler by drain_by
    GONE = "gone"  # its instance is over; the server goes or went


_NODE_STATE = {
    State.REQUESTED: NodeState.JOINING,
    State.CREATING: NodeState.JOINING,
    State.ACTIVE: NodeState.JOINING,
    State.READY: NodeState.SERVING,
    State.NOTICED: NodeState.LEAVING,
    State.DRAINING: NodeState.LEAVING,
    State.TERMINATING: NodeState.GONE,
    State.FAILED: NodeState.GONE,
    State.GONE: NodeState.GONE,
}


class AckStatus(StrEnum):
    """What a node's agent answers to a contract."""

    DRAINED = "drained"  # out of its scheduler: nothing runs there
    LEFT = "left"  # drained and the node stopped itself
    FAILED = "failed"  # the drain failed; the detail says why


@dataclass(frozen=True, slots=True)
class Terms:
    """What the node is told, and nothing else: a change here is a new version."""

    partition: str
    pool: str
    capacity_class: str
    plan_generation: int
    state: NodeState
    drain_by: float | None
    reclaim: bool = False  # leaving because the cloud takes the server back (may cut work)


def terms_of(instance: Instance) -> Terms:
    """A noticed node must leave by its notice's deadline even before sco drains it."""
    drain_by = instance.drain_by if instance.drain_by is not None else instance.notice_deadline
    state = _NODE_STATE[instance.state]
    return Terms(
        partition=instance.partition,
        pool=instance.pool,
        capacity_class=str(instance.capacity_class),
        plan_generation=instance.plan_generation,
        state=state,
        drain_by=drain_by if state is NodeState.LEAVING else None,
        # A reclaim may requeue work to leave in time; sco's own moves only drain.
        reclaim=state is NodeState.LEAVING and instance.notice_deadline is not None,
    )


class MalformedContract(ValueError):
    """A document that is not a contract: the message names the field missing or
    malformed."""


@dataclass(frozen=True, slots=True)
class Contract:
    """A node's terms at one version: where it belongs, until when, and when it must leave."""

    instance_id: str
    version: int
    terms: Terms
    join: str  # how to join its scheduler (endpoint or token reference, never a secret)
    lease_expires_at: float  # trust this contract until then without hearing again

    @property
    def drain_by(self) -> float | None:
        return self.terms.drain_by

    def as_json(self) -> dict[str, object]:
        t = self.terms
        return {
            "instance_id": self.instance_id,
            "version": self.version,
            "partition": t.partition,
            "pool": t.pool,
            "capacity_class": t.capacity_class,
            "plan_generation": t.plan_generation,
            "state": str(t.state),
            "drain_by": t.drain_by,
            "reclaim": t.reclaim,
            "join": self.join,
            "lease_expires_at": self.lease_expires_at,
        }

    @classmethod
    def from_json(cls, doc: object) -> Contract:
        """The contract `as_json` gave (what the distributor sends, and what an agent
        keeps). Fields it does not know are ignored; `reclaim` may be missing (False).
        Raises MalformedContract naming the first field missing or malformed."""
        if not isinstance(doc, Mapping):
            raise MalformedContract(f"a contract is a JSON object, not {type(doc).__name__}")
        state = _text(doc, "state")
        if state not in {str(s) for s in NodeState}:
            raise MalformedContract(f"state: {state!r} is none of {', '.join(NodeState)}")
        drain_by = doc.get("drain_by")
        reclaim = doc.get("reclaim", False)
        if not isinstance(reclaim, bool):
            raise MalformedContract(f"reclaim: {reclaim!r} is not true or false")
        return cls(
            instance_id=_text(doc, "instance_id"),
            version=_integer(doc, "version"),
            terms=Terms(
                partition=_text(doc, "partition"),
                pool=_text(doc, "pool"),
                capacity_class=_text(doc, "capacity_class"),
                plan_generation=_integer(doc, "plan_generation"),
                state=NodeState(state),
                drain_by=None if drain_by is None else _number(doc, "drain_by"),
                reclaim=reclaim,
            ),
            join=_text(doc, "join"),
            lease_expires_at=_number(doc, "lease_expires_at"),
        )


def _present(doc: Mapping[str, object], name: str) -> object:
    if name not in doc:
        raise MalformedContract(f"{name}: missing")
    return doc[name]


def _text(doc: Mapping[str, object], name: str) -> str:
    value = _present(doc, name)
    if not isinstance(value, str):
        raise MalformedContract(f"{name}: {value!r} is not a string")
    return value


def _integer(doc: Mapping[str, object], name: str) -> int:
    value = _present(doc, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedContract(f"{name}: {value!r} is not an integer")
    return value


def _number(doc: Mapping[str, object], name: str) -> float:
    value = _present(doc, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedContract(f"{name}: {value!r} is not a finite number")
    return float(value)


@dataclass(frozen=True, slots=True)
class StoredContract:
    """A contract as fleet state keeps it: the node's terms at their version, its
    server, the token's digest and expiry (never the token), and the agent's last
    answer."""

    instance_id: str
    version: int
    terms: Terms
    server_id: str | None
    changed_at: float
    token_expires_at: float | None
    ack_version: int | None
    ack_status: AckStatus | None
    ack_detail: str | None
    ack_at: float | None
    token_hash: str | None = None  # the digest, never the token
    # The token the current one replaced, still accepted until it expires: a node may
    # hold it (the new one was stored before it was delivered, and a writer that
    # stopped in between may deliver its own late).
    prev_token_hash: str | None = None
    prev_token_expires_at: float | None = None
    # The token last seen to reach the node, still accepted until it expires: the
    # current one may be undelivered (the cloud was away), and so the replaced one.
    delivered_token_hash: str | None = None
    delivered_token_expires_at: float | None = None

    @property
    def acked(self) -> AckStatus | None:
        """The agent's answer to this very version, if any."""
        return self.ack_status if self.ack_version == self.version else None

    def token_valid(self, now: float) -> bool:
        """Whether its token (if any) has not expired."""
        return self.token_expires_at is not None and self.token_expires_at > now

    def digests(self) -> tuple[str, ...]:
        """The digests a node may present for this contract (expired or not)."""
        held = (self.token_hash, self.prev_token_hash, self.delivered_token_hash)
        return tuple(dict.fromkeys(d for d in held if d))

    def accepts(self, digest: str, now: float) -> bool:
        """Whether a node presenting a token with `digest` is this contract's node: the
        current token, the one it replaced, or the last one seen delivered, each until
        its own expiry."""
        held = (
            (self.token_hash, self.token_expires_at),
            (self.prev_token_hash, self.prev_token_expires_at),
            (self.delivered_token_hash, self.delivered_token_expires_at),
        )
        return any(digest == d and until is not None and until > now for d, until in held)


def token_digest(token: str) -> str:
    """What fleet state keeps of a node token. Tokens are 256 random bits, so a plain
    SHA-256 (no salt, no stretching) is enough to make the stored value useless."""
    return hashlib.sha256(token.encode()).hexdigest()
