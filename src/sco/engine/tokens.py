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

A token handed over can still be taken away: Nova writes a server's metadata whole,
so a reclaim notice set at the same moment wrote one away (seen on a loaded test
run; the reclaimer picks new servers first, the ones getting their tokens). A server
listed without the token this issuer handed it in an earlier cycle gets a new one;
so does one listed without a token in two listings running that fleet state does not
queue: its token was handed over before this issuer started (another leader's, or
this process before a restart), and this issuer did not see it go.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence

from sco.domain.contracts import token_digest
from sco.domain.instances import Instance
from sco.ports import ProviderError, Secret, ServerView, TokenCourier, TokenLedger

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
        # server -> (instance, when) of the tokens this issuer handed over lately
        self._handed: dict[str, tuple[str, float]] = {}
        self._pruned_at = float("-inf")
        self._missing: set[str] = set()  # servers the last listing showed without a token

    def issue(
        self,
        partition: str,
        now: float,
        fence: int = 0,
        tokenless: Mapping[str, str] | None = None,
    ) -> int:
        """Tokens for the partition's servers that have none, an old one, one whose
        delivery was not seen, or one handed over that the listing no longer shows
        (`tokenless`: server -> instance of the servers listed without a token);
        written with the partition's fencing token (FencedOut when another leader
        holds a newer one)."""
        issued = 0
        due = self.ledger.untokened(partition, now + self.ttl_s / 2, now - self.undelivered_grace_s)
        due += self._taken_away(tokenless or {}, due, now)
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
            self._handed[server_id] = (instance_id, now)
            issued += 1
        self.issued_total += issued
        return issued

    def _taken_away(
        self, tokenless: Mapping[str, str], due: list[tuple[str, str]], now: float
    ) -> list[tuple[str, str]]:
        """Tokens the servers listed without one should hold, by fleet state: one this
        issuer handed over in an earlier cycle (whose listing came after), or, listed
        so twice running, one it did not hand over: another leader's, or one whose
        delivery failed (Nova refuses metadata while a server builds; this issuer is
        delivering nothing else to it, so it need not wait out the ledger's grace).
        One handed over before half the lifetime is renewed anyway, so it is
        forgotten (an hour at a time: a cycle does not walk every token)."""
        recent = now - self.ttl_s / 2
        if now - self._pruned_at >= 3600.0:
            self._handed = {s: h for s, h in self._handed.items() if h[1] >= recent}
            self._pruned_at = now
        before, self._missing = self._missing, set(tokenless)
        if not tokenless:
            return []
        queued = {server_id for _, server_id in due}
        lost: list[tuple[str, str]] = []
        for s, instance_id in tokenless.items():
            h = self._handed.get(s)
            if s in queued or (h is None and s not in before):
                continue  # due anyway, or a first sight (this issuer may be new)
            if h is None or (h[1] < now and (h[1] >= recent or s in before)):
                lost.append((instance_id, s))
        for _, server_id in lost:
            log.warning(
                "token of %s gone from its server (another write to its metadata took "
                "it): a new one", server_id,
            )  # fmt: skip
        return lost


def tokenless(servers: Sequence[ServerView], records: Iterable[Instance]) -> dict[str, str]:
    """Server -> instance of the listed servers that show no token, of the records
    held (most cycles none: the records are not walked then)."""
    missing = {v.server_id for v in servers if v.token_missing}
    if not missing:
        return {}
    return {s: i.id for i in records if (s := i.server_id) is not None and s in missing}
