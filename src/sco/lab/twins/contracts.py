"""Node contracts in memory: `sco.ports.Contracts` without a database, for the lab.

What `sco.adapters.sqlstate.contracts` keeps in its two tables this keeps in two
dicts and a list: one contract per instance, written with the transitions that
change its terms (its version grows only then), a change log whose ids grow, tokens
stored under the partition's fencing token, and acknowledgements that name a
version. `tests/conformance/test_contracts.py` holds both to the same rules.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sco.domain.contracts import AckStatus, NodeState, StoredContract, terms_of
from sco.domain.instances import Change
from sco.lab.twins.leases import MemoryLeaseTable
from sco.ports.contracts import Listener


@dataclass(slots=True)
class _Row:
    contract: StoredContract
    token_set_at: float | None = None
    token_delivered: bool = False


class MemoryContracts:
    """Every role of the contracts of one `MemoryFleetStore`."""

    def __init__(self, leases: MemoryLeaseTable, wall: Callable[[], float] = time.time) -> None:
        """`leases`: whose tokens fence `set_token`; `wall`: when a change is logged (as
        the database, wall time: replicas prune the log by it)."""
        self.leases = leases
        self.wall = wall
        self._rows: dict[str, _Row] = {}
        self._log: list[tuple[int, str, float]] = []  # (change id, instance, at)
        self._last = 0

    # ------------------------------------------------------------ written by fleet state

    def record(self, changes: Sequence[Change]) -> None:
        """The contracts `changes` touch, with the transitions (the caller's batch)."""
        moved: list[str] = []
        for ch in changes:
            terms, server = terms_of(ch.after), ch.after.server_id
            row = self._rows.get(ch.after.id)
            if row is None:
                new = StoredContract(ch.after.id, 1, terms, server, ch.at, *(None,) * 5)
                self._rows[ch.after.id] = _Row(new)
            elif row.contract.terms != terms or row.contract.server_id != server:
                old = row.contract
                row.contract = dataclasses.replace(
                    old, version=old.version + 1, terms=terms, server_id=server, changed_at=ch.at
                )
            else:
                continue
            moved.append(ch.after.id)
        self._changed(moved)

    def _changed(self, instance_ids: Sequence[str]) -> None:
        at = self.wall()
        for instance_id in instance_ids:
            self._last += 1
            self._log.append((self._last, instance_id, at))

    def _set(self, instance_id: str, **fields: object) -> None:
        row = self._rows[instance_id]
        row.contract = dataclasses.replace(row.contract, **fields)  # type: ignore[arg-type]

    # ------------------------------------------------------------ TokenLedger

    def untokened(
        self, partition: str, renew_before: float, undelivered_before: float
    ) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for instance_id, row in self._rows.items():
            c = row.contract
            if c.terms.partition != partition or c.server_id is None:
                continue
            if c.terms.state is NodeState.GONE:
                continue
            expires = c.token_expires_at
            stuck = not row.token_delivered and (row.token_set_at or 0.0) < undelivered_before
            if c.token_hash is None or (expires is not None and expires < renew_before) or stuck:
                out.append((instance_id, c.server_id))
        return out

    def set_token(
        self, instance_id: str, token_hash: str, expires_at: float, now: float, fence: int = 0
    ) -> bool:
        row = self._rows.get(instance_id)
        if row is None:
            return False
        self.leases.check({row.contract.terms.partition}, fence)
        old = row.contract
        replaced = _unexpired(old.token_expires_at, now)
        self._set(
            instance_id,
            token_hash=token_hash,
            token_expires_at=expires_at,
            prev_token_hash=old.token_hash if replaced else None,
            prev_token_expires_at=old.token_expires_at if replaced else None,
        )
        row.token_set_at, row.token_delivered = now, False
        self._changed([instance_id])
        return True

    def token_delivered(self, instance_id: str, token_hash: str) -> None:
        row = self._rows.get(instance_id)
        if row is not None and row.contract.token_hash == token_hash:
            row.token_delivered = True
            self._set(
                instance_id,
                delivered_token_hash=token_hash,
                delivered_token_expires_at=row.contract.token_expires_at,
            )

    # ------------------------------------------------------------ TokenAdmin, AckReader

    def revoke(self, partition: str, instance_id: str | None = None) -> int:
        ids = [
            i
            for i, row in self._rows.items()
            if row.contract.terms.partition == partition and instance_id in (None, i)
        ]
        for i in ids:
            self._set(
                i, token_hash=None, token_expires_at=None, prev_token_hash=None,
                prev_token_expires_at=None, delivered_token_hash=None,
                delivered_token_expires_at=None,
            )  # fmt: skip
        self._changed(ids)
        return len(ids)

    def drained_servers(self, partition: str) -> set[str]:
        left = (AckStatus.DRAINED, AckStatus.LEFT)
        return {
            c.server_id
            for c in (row.contract for row in self._rows.values())
            if c.terms.partition == partition and c.terms.state is NodeState.LEAVING
            and c.acked in left and c.server_id
        }  # fmt: skip

    # ------------------------------------------------------------ ContractFeed

    def get(self, instance_id: str) -> StoredContract | None:
        row = self._rows.get(instance_id)
        return row.contract if row is not None else None

    def get_many(self, instance_ids: Sequence[str]) -> dict[str, StoredContract]:
        return {i: self._rows[i].contract for i in instance_ids if i in self._rows}

    def by_token(self, token_hash: str, now: float) -> StoredContract | None:
        for row in self._rows.values():
            if row.contract.accepts(token_hash, now):
                return row.contract
        return None

    def of_partition(self, partition: str) -> list[StoredContract]:
        return [r.contract for r in self._rows.values() if r.contract.terms.partition == partition]

    def current(self, gone_since: float) -> list[StoredContract]:
        return [
            r.contract
            for r in self._rows.values()
            if r.contract.terms.state is not NodeState.GONE or r.contract.changed_at >= gone_since
        ]

    def last_change(self) -> int:
        return self._last

    def changed_since(self, after: int, limit: int = 50_000) -> tuple[int, set[str]]:
        start = bisect.bisect_right(self._log, after, key=lambda entry: entry[0])
        newer = self._log[start : start + limit]
        if not newer:
            return after, set()
        return newer[-1][0], {i for _, i, _ in newer}

    def prune_changes(self, before: float) -> int:
        kept = [entry for entry in self._log if entry[2] >= before]
        pruned, self._log = len(self._log) - len(kept), kept
        return pruned

    def ack(
        self, instance_id: str, version: int, status: AckStatus, detail: str, at: float
    ) -> bool:
        row = self._rows.get(instance_id)
        if row is None or row.contract.version != version:
            return False
        self._set(instance_id, ack_version=version, ack_status=status, ack_detail=detail, ack_at=at)
        return True

    def listener(self) -> Listener | None:
        return None  # nothing commits elsewhere: ask `changed_since`


def _unexpired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and expires_at > now
