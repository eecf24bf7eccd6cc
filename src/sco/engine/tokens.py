"""Node tokens: issued to each server once it exists, renewed before they expire.

A token is 256 random bits handed to the server through the provider (its
metadata, which only the server and the project can read) and kept in fleet
state only as its SHA-256. Its digest is stored first, under the partition's
fencing token, then it is delivered, then marked delivered. A stale leader cannot
store one; a leader that stopped between storing and delivering leaves a token not
marked delivered, issued again after `undelivered_grace_s`, and if it delivers its
own late, that is the replaced token, which stays accepted until it expires. So the
node never holds a token fleet state refuses (it did: a stale and a new leader
interleaved, the node holding one token and the store the other's digest).
"""

from __future__ import annotations

import logging
import secrets

from sco.domain.contracts import token_digest
from sco.ports import ProviderError, Secret, TokenCourier, TokenLedger

log = logging.getLogger(__name__)


class TokenIssuer:
    def __init__(
        self,
        ledger: TokenLedger,
        courier: TokenCourier,
        ttl_s: float,
        per_cycle: int = 100,
        undelivered_grace_s: float = 60.0,
    ) -> None:
        self.ledger = ledger
        self.courier = courier
        self.ttl_s = ttl_s
        self.per_cycle = per_cycle  # a burst of new servers is served over a few cycles
        self.undelivered_grace_s = undelivered_grace_s
        self.issued_total = 0

    def issue(self, partition: str, now: float, fence: int = 0) -> int:
        """Tokens for the partition's servers that have none, an old one, or one whose
        delivery was not seen; written with the partition's fencing token (FencedOut
        when another leader holds a newer one)."""
        issued = 0
        due = self.ledger.untokened(partition, now + self.ttl_s / 2, now - self.undelivered_grace_s)
        for instance_id, server_id in due[: self.per_cycle]:
            token = Secret(secrets.token_urlsafe(32))
            digest = token_digest(token.reveal())
            if not self.ledger.set_token(instance_id, digest, now + self.ttl_s, now, fence):
                continue  # gone, or another writer set one first
            try:
                self.courier.deliver_token(server_id, token)
            except ProviderError as e:
                log.warning(
                    "partition %s: token for %s not delivered (again in %.0f s): %s",
                    partition, instance_id, self.undelivered_grace_s, e,
                )  # fmt: skip
                continue
            self.ledger.token_delivered(instance_id, digest)
            issued += 1
        self.issued_total += issued
        return issued
