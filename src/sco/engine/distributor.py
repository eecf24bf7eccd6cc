"""The contract distributor's logic, under its HTTP app (`sco.apps.distributor`).

Each replica keeps a copy of the contracts a node may ask for (`Mirror`), loaded
at start and then kept current from fleet state's change log (`ChangeFeed`: on
PostgreSQL a NOTIFY in the writing transaction wakes it, elsewhere it looks
every `poll_s`). Reads and long polls are answered from the copy; a change wakes
exactly the requests waiting on that contract. With fleet state away the copy
goes on answering with what it knows, and the feed says it is not `healthy`.

Everything here is typed against `sco.ports.ContractFeed`: the feed never knows
which database it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable

from sco.domain.contracts import AckStatus, Contract, NodeState, StoredContract
from sco.ports.contracts import ContractFeed, Listener

log = logging.getLogger(__name__)


class Mirror:
    """This replica's copy of the contracts a node may ask for, by instance and by
    token digest: requests are answered from it, without a database read."""

    def __init__(self, gone_keep_s: float) -> None:
        self.gone_keep_s = gone_keep_s
        self.rows: dict[str, StoredContract] = {}
        self._by_digest: dict[str, str] = {}

    def load(self, rows: Iterable[StoredContract], now: float) -> None:
        self.rows.clear()
        self._by_digest.clear()
        self.apply(rows, now=now)

    def apply(self, rows: Iterable[StoredContract], now: float) -> None:
        for row in rows:
            old = self.rows.get(row.instance_id)
            if old is not None and old.version > row.version:
                # A read that began before a newer version this copy already holds
                # (from a request's own read): a node never sees its contract go back.
                continue
            if old is not None:
                for digest in set(old.digests()) - set(row.digests()):
                    self._by_digest.pop(digest, None)
            if row.terms.state is NodeState.GONE and row.changed_at < now - self.gone_keep_s:
                self.rows.pop(row.instance_id, None)
                continue
            self.rows[row.instance_id] = row
            for digest in row.digests():
                self._by_digest[digest] = row.instance_id

    def by_digest(self, digest: str, now: float) -> StoredContract | None:
        instance_id = self._by_digest.get(digest)
        row = self.rows.get(instance_id) if instance_id else None
        if row is None or not row.accepts(digest, now):
            return None
        return row


class ChangeFeed:
    """Keeps the mirror current from the change log and wakes the requests waiting
    on contracts that changed. Its methods run on one event loop."""

    def __init__(
        self,
        contracts: ContractFeed,
        poll_s: float,
        gone_keep_s: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: the time contracts are written in, by which gone ones age (wall
        time; the swarm's simulated clock in the lab)."""
        self.contracts = contracts
        self.poll_s = poll_s
        self.clock = clock
        self.mirror = Mirror(gone_keep_s)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._poke = asyncio.Event()
        self.last = 0
        self.loaded = False
        self.healthy = False
        # Whether the copy was ever filled: before, a token missing from it says
        # nothing about the token.
        self.copied = False
        self._pruned_at = 0.0

    def register(self, instance_id: str) -> asyncio.Event:
        ev = asyncio.Event()
        self._waiters.setdefault(instance_id, set()).add(ev)
        return ev

    def unregister(self, instance_id: str, ev: asyncio.Event) -> None:
        waiting = self._waiters.get(instance_id)
        if waiting is not None:
            waiting.discard(ev)
            if not waiting:
                del self._waiters[instance_id]

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def poke(self) -> None:
        self._poke.set()

    @contextlib.asynccontextmanager
    async def following(self, listen: Listener | None) -> AsyncIterator[None]:
        """Keep the copy current while the block runs: `run` as a task and, with
        `listen` (fleet state's own news of changes), a thread that pokes it."""
        task = asyncio.create_task(self.run())
        stop = threading.Event()
        if listen is not None:
            loop = asyncio.get_running_loop()
            threading.Thread(
                target=listen,
                args=(lambda: loop.call_soon_threadsafe(self.poke), stop),
                name="contracts-listen",
                daemon=True,
            ).start()
        try:
            yield
        finally:
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _load(self) -> None:
        """Everything, from where the change log stands (read first: a change after
        it is read again, which is harmless)."""
        last = await asyncio.to_thread(self.contracts.last_change)
        gone_since = self.clock() - self.mirror.gone_keep_s
        rows = await asyncio.to_thread(self.contracts.current, gone_since)
        self.mirror.load(rows, self.clock())
        self.last = last
        self.copied = True
        # Fleet state answered: ready, not "unreachable" while the first follow of
        # the change log is still to come (found by a loaded CI run).
        self.loaded = self.healthy = True
        log.info("distributor: %d contracts loaded (changes up to %d)", len(rows), last)

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as e:  # the database is away: serve what is known
                if self.healthy or not self.loaded:
                    log.warning("distributor: cannot read contract changes: %s", e)
                self.healthy = False
                # Back, read everything again: meanwhile the log may have been pruned
                # past where this copy stands.
                self.loaded = False
                await asyncio.sleep(min(5.0, self.poll_s * 4))
                continue
            # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that
            # arrives as the poke does, and the app's shutdown then waited forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._poke.wait()
            self._poke.clear()

    async def refresh(self) -> None:
        """Bring the copy up to date once: everything again if it was lost, else the
        changes since it was. Raises what fleet state raised."""
        if not self.loaded:
            await self._load()
            self._wake(self.mirror.rows)  # anything waited on may have moved
        await self._follow()
        self.healthy = True

    async def _follow(self) -> None:
        last, changed = await asyncio.to_thread(self.contracts.changed_since, self.last)
        if changed:
            rows = await asyncio.to_thread(self.contracts.get_many, sorted(changed))
            self.mirror.apply(rows.values(), now=self.clock())
            self.last = last
            self._wake(changed)
        # The change log is stamped with wall time by whoever writes it, whatever the
        # clock the contracts are read by.
        if time.time() - self._pruned_at > 600:
            self._pruned_at = time.time()
            await asyncio.to_thread(self.contracts.prune_changes, time.time() - 3600)

    def learn(self, row: StoredContract) -> None:
        """A row a request read from fleet state itself: newer than this copy, so
        the copy takes it (else the next request, served from the copy, would see
        an older version than this one did)."""
        self.mirror.apply([row], now=self.clock())
        self._wake([row.instance_id])

    def _wake(self, instance_ids: Iterable[str]) -> None:
        for instance_id in instance_ids:
            for ev in self._waiters.get(instance_id, ()):
                ev.set()

    async def find(
        self, digest: str, now: float, may_look_further: Callable[[], bool]
    ) -> StoredContract | None:
        """The contract whose unexpired token has `digest`, from the copy; from fleet
        state itself when the copy is not filled yet, or (a token issued a moment
        ago) when `may_look_further()` allows the read. Raises ContractsUnavailable
        when fleet state is asked and cannot answer."""
        row = self.mirror.by_digest(digest, now)
        if row is None and (not self.copied or may_look_further()):
            row = await asyncio.to_thread(self.contracts.by_token, digest, now)
            if row is not None:
                self.learn(row)
        return row

    async def newer(self, row: StoredContract, known: int, wait_s: float) -> StoredContract:
        """The contract once its version is other than `known`, or as it stands after
        `wait_s`. The mirror changes only in this event loop, and wakes whoever is
        registered when it does: nothing slips between reading it and registering."""
        ev = self.register(row.instance_id)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                fresh = self.mirror.rows.get(row.instance_id, row)
                if fresh.version != known:
                    return fresh
                left = deadline - time.monotonic()
                if left <= 0:
                    return fresh
                ev.clear()
                with contextlib.suppress(TimeoutError):  # not wait_for: see run
                    async with asyncio.timeout(left):
                        await ev.wait()
        finally:
            self.unregister(row.instance_id, ev)

    async def ack(
        self, instance_id: str, version: int, status: AckStatus, detail: str, at: float
    ) -> bool:
        """Record the agent's answer to `version` in fleet state; False when that is not
        the current one. Raises ContractsUnavailable when fleet state cannot answer."""
        return await asyncio.to_thread(self.contracts.ack, instance_id, version, status, detail, at)


def contract_of(row: StoredContract, join: str, lease_expires_at: float) -> Contract:
    """What the node is told of its stored contract: its terms at their version, how
    to join its scheduler, and until when to trust this without hearing again."""
    return Contract(
        instance_id=row.instance_id,
        version=row.version,
        terms=row.terms,
        join=join,
        lease_expires_at=lease_expires_at,
    )
