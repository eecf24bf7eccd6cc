"""Node tokens: issued to each server once it exists, renewed before they expire.

A token is 256 random bits handed to the server through the provider (its
metadata, which only the server and the project can read) and kept in fleet
state only as its SHA-256. It is sent before its digest is stored, so a crash
in between leaves a contract without a token, which the next cycle issues
again; the agent reads its token again when the distributor refuses it.
"""

from __future__ import annotations

import logging
import secrets

from sco.domain.contracts import token_digest
from sco.ports import ProviderError, Secret, TokenCourier, TokenLedger

log = logging.getLogger(__name__)


class TokenIssuer:
    def __init__(
        self, ledger: TokenLedger, courier: TokenCourier, ttl_s: float, per_cycle: int = 100
    ) -> None:
        self.ledger = ledger
        self.courier = courier
        self.ttl_s = ttl_s
        self.per_cycle = per_cycle  # a burst of new servers is served over a few cycles
        self.issued_total = 0

    def issue(self, partition: str, now: float) -> int:
        """Tokens for the partition's servers that have none (or an old one)."""
        issued = 0
        due = self.ledger.untokened(partition, now + self.ttl_s / 2)
        for instance_id, server_id in due[: self.per_cycle]:
            token = Secret(secrets.token_urlsafe(32))
            try:
                self.courier.deliver_token(server_id, token)
            except ProviderError as e:
                log.warning(
                    "partition %s: token for %s not delivered: %s", partition, instance_id, e
                )
                continue
            self.ledger.set_token(instance_id, token_digest(token.reveal()), now + self.ttl_s)
            issued += 1
        self.issued_total += issued
        return issued
