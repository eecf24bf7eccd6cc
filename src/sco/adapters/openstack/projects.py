"""What sco's listings leave out and its actions refuse. sco's projects only: the
servers of other projects in a listing are reported once and left alone, and an
action by id on a server Nova places in another project is refused
(`ForeignServer`), whatever the credential would allow. This installation's servers
only, where several sco share a project. And servers sco deleted, until Nova
forgets them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sco.adapters.openstack.answers import ServerAnswer, read
from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.resources import installation_of
from sco.adapters.openstack.scope import Ownership
from sco.domain.installation import is_mine
from sco.ports import Clock, PermanentProviderError

log = logging.getLogger("sco.adapters.openstack.provider")

FOREIGN_TTL_S = 300.0  # a listing's foreign servers count this long after it
Records = list[dict[str, Any]]  # Nova records, as answered
Ids = list[str]


class ForeignServer(PermanentProviderError):
    """Asked to act on a server outside sco's projects: refused, the rest done."""


@dataclass
class Tombstones:
    """Servers sco deleted, hidden from listings until Nova forgets them."""

    ttl_s: float
    at: dict[str, float] = field(default_factory=dict)

    def add(self, ids: Sequence[str], now: float) -> None:
        for sid in ids:
            self.at[sid] = now

    def hides(self, sid: str, now: float) -> bool:
        when = self.at.get(sid)
        if when is None:
            return False
        if now - when > self.ttl_s:
            del self.at[sid]
            return False
        return True


class ProjectGuard:
    """What keeps `OpenStackProvider` to sco's projects and its installation: which
    listed servers are sco's, the foreign ones seen (reported once, never acted on),
    and the actions by id it refused."""

    def __init__(self, client: CloudClient, clock: Clock, installation: str) -> None:
        self.client = client
        self.clock = clock
        self.installation = installation
        # sco's projects, once claimed; None: not established (tests that build a
        # provider by hand), and then every listed server counts as sco's.
        self.owned: Ownership | None = None
        self.refused_total = 0  # actions by id refused on foreign servers
        self._lock = threading.Lock()
        self._own_ids: dict[str, frozenset[str]] = {}  # by listing: sco's servers in it
        # by listing: when, and its foreign servers (id -> project); a listing not
        # made again for FOREIGN_TTL_S (a partition another replica leads now) is dropped
        self._foreign: dict[str, tuple[float, dict[str, str]]] = {}
        self._warned: set[str] = set()

    def mine(self, records: Records) -> Records:
        """The records of this installation: another sco's servers in the same project
        (perhaps with a partition of the same name) are never adopted or deleted."""
        return [s for s in records if is_mine(installation_of(s), self.installation)]

    def ours(self, records: Records, listing: str | None) -> Records:
        """The records of sco's projects. The others are foreign: each is reported
        once and left out. `listing` names what was listed (a partition, or `*`), so
        that the foreign servers and sco's own are known per listing; None: a
        lookup not to remember."""
        if self.owned is None:
            return records
        ours: Records = []
        foreign: dict[str, str] = {}
        for s in records:
            project = s.get("tenant_id", s.get("project_id"))
            if self.owned.owns(project):
                ours.append(s)
            else:
                foreign[str(s.get("id", ""))] = str(project)
        with self._lock:
            if listing is not None:
                self._foreign[listing] = (self.clock.now(), foreign)
                self._own_ids[listing] = frozenset(str(s.get("id", "")) for s in ours)
            new = [sid for sid in foreign if sid not in self._warned]
            self._warned.update(new)
            seen = set(foreign).union(*(found for _, found in self._foreign.values()))
            self._warned &= seen
        for sid in new:
            self._warn_foreign(sid, foreign[sid], "in a listing")
        return ours

    def _warn_foreign(self, server_id: str, project: str, where: str) -> None:
        assert self.owned is not None
        log.warning(
            "foreign server %s in project %s left alone (%s): sco's projects are %s",
            server_id,
            project,
            where,
            ", ".join(sorted(self.owned.projects)),
        )

    def foreign(self) -> dict[str, str]:
        """Servers of other projects in sco's latest listings: id -> project."""
        now = self.clock.now()
        with self._lock:
            merged: dict[str, str] = {}
            for at, found in self._foreign.values():
                if now - at <= FOREIGN_TTL_S:
                    merged.update(found)
        return merged

    def foreign_servers(self) -> dict[str, int]:
        """Servers of other projects in sco's latest listings, by project."""
        counts: dict[str, int] = {}
        for project in self.foreign().values():
            counts[project] = counts.get(project, 0) + 1
        return counts

    def refuse_foreign(self, server_ids: Sequence[str], action: str) -> tuple[Ids, Ids]:
        """(sco's, refused): ids of sco's latest listings are sco's; any other is
        looked up, and refused unless Nova says it is in one of sco's projects. A
        server Nova no longer has is in neither (there is nothing to act on)."""
        if self.owned is None:
            return list(server_ids), []
        with self._lock:
            known = frozenset().union(*self._own_ids.values())
        ours: Ids = []
        refused: Ids = []
        for sid in server_ids:
            if sid in known:
                ours.append(sid)
                continue
            answer = self.client.get("compute", f"/servers/{sid}", ok_missing=True)
            if answer is None:
                continue
            project = read(ServerAnswer, answer, f"compute GET /servers/{sid}").server.tenant_id
            if self.owned.owns(project):
                ours.append(sid)
            else:
                refused.append(sid)
                self._warn_foreign(sid, str(project), f"refused to {action} it")
        self.refused_total += len(refused)
        return ours, refused

    def own_only(self, server_id: str, action: str) -> None:
        _, refused = self.refuse_foreign([server_id], action)
        if refused:
            raise ForeignServer(f"refused to {action} {server_id}: not in sco's projects")
