"""The provider port on OpenStack: Nova creates and lists, Placement tells headroom.

- **Pools** are (hall, flavor) pairs from the region file. A hall is a Nova host
  aggregate with an availability zone; a flavor is a Placement resource request
  (custom spot resource classes, traits, and Ironic's zeroed VCPU/MEMORY_MB/
  DISK_GB all come from its extra specs).
- **Headroom** is read in the background, one `GET /allocation_candidates` per
  distinct (request, aggregate) with its provider summaries, and served from
  that cache; the decision path never waits for Placement. Headroom older than
  `headroom_stale_s` counts as none, so nothing is created on old news.
- **Create** sends one multi-create and returns: the scheduler's answer is
  not waited for (it takes about a second, a minute under load, and a cycle
  must not). The servers appear in the next listing by their request tag;
  ones the scheduler could not place (ERROR with NoValidHost: Nova places all
  of a batch or none) are listed as `refused`, and the controller fails them,
  deletes them and sends smaller batches to that pool.
- **Tags** carry the partition and request id (listing filters on them), and
  metadata the pool, class and plan generation, so a restarted controller
  adopts what exists; a request id whose servers exist is never sent again.
- **Only sco's projects.** Tags are anyone's to set, so a tag never makes a
  server sco's: a server whose project (`tenant_id`) is not one of sco's
  (`claim`) is foreign, reported once and left alone: never adopted, deleted,
  noticed or handed a token. Deleting, noticing and handing a token by id also
  check the id against sco's own listings, or ask Nova whose server it is.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sco.adapters.openstack import placement
from sco.adapters.openstack.answers import (
    Aggregates,
    Created,
    Flavor,
    Image,
    Images,
    LimitsAnswer,
    MalformedAnswer,
    Metadata,
    page,
    read,
)
from sco.adapters.openstack.client import CloudClient
from sco.adapters.openstack.config import PoolSpec, RegionSpec
from sco.adapters.openstack.placement import Want
from sco.adapters.openstack.projects import ForeignServer, Ids, ProjectGuard, Records, Tombstones
from sco.adapters.openstack.resources import (
    META_NODE_TOKEN,
    META_PARTITION,
    META_RECLAIM_AT,
    TAG,
    QuotaRoom,
    ResourceRequest,
    flavor_request,
    notice_in_force,
    partition_tag,
    request_tag,
    server_metadata,
    server_tags,
    server_views,
)
from sco.adapters.openstack.scope import NEEDED_ROLES, CredentialScope, excess, ownership
from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import Pool, PoolId
from sco.ports import (
    Clock,
    CreateResult,
    Credential,
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    RetryableProviderError,
    Secret,
    ServerView,
)

log = logging.getLogger(__name__)

_PAGE = 1000


class RegionError(ValueError):
    """The region file names things the cloud does not have; the message lists them."""


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    pool: Pool
    spec: PoolSpec
    flavor_id: str
    vcpus: int
    ram_mb: int
    request: ResourceRequest
    aggregate_uuid: str


@dataclass(frozen=True, slots=True)
class HeadroomCache:
    at: float
    rooms: Mapping[PoolId, int]
    quota: QuotaRoom
    took_s: float
    calls: int


class OpenStackProvider:
    """`sco.ports.Provider` over one cloud. Thread-safe for one controller thread
    per partition plus the headroom refresher."""

    def __init__(
        self,
        region: RegionSpec,
        client: CloudClient,
        clock: Clock,
        read_scope: Callable[[], CredentialScope] | None = None,
        installation: str = DEFAULT_INSTALLATION,
        held_credential: Callable[[], Credential | None] = lambda: None,
    ) -> None:
        """`installation` names this sco among those that may share the cloud's projects:
        its servers are tagged with it, and it lists, adopts and deletes only those."""
        self.region = region
        self.client = client
        self.clock = clock
        self._read_scope = read_scope
        self.held_credential = held_credential  # the one in use (its version, source)
        self.guard = ProjectGuard(client, clock, installation)  # sco's projects only
        self.scope: CredentialScope | None = None
        self.excess: list[str] = []  # what the credential could do beyond sco's needs
        self._pools: dict[PoolId, ResolvedPool] = {}
        self._placement = placement.PlacementHeadroom(client, clock)
        self._image_id = ""
        self._cache: HeadroomCache | None = None
        self._lock = threading.Lock()
        self._tombstones = Tombstones(ttl_s=600.0)
        self._last_listing: dict[str, tuple[ServerView, ...]] = {}
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self.last_refresh_error = ""

    @property
    def installation(self) -> str:
        """Which sco this is among those sharing the cloud's projects (its tags)."""
        return self.guard.installation

    @property
    def refused_total(self) -> int:
        """Actions by server id refused: the server is not in sco's projects."""
        return self.guard.refused_total

    def foreign(self) -> dict[str, str]:
        """Servers of other projects in sco's latest listings: id -> project."""
        return self.guard.foreign()

    def foreign_servers(self) -> dict[str, int]:
        return self.guard.foreign_servers()

    # ------------------------------------------------------------ start-up

    def claim(
        self, projects: Collection[str], creates: bool, roles: Collection[str] = NEEDED_ROLES
    ) -> CredentialScope:
        """Read the credential's scope and take sco's projects: `projects`, else the
        credential's own (`sco.adapters.openstack.scope.ownership`, whose ScopeError
        this raises); `creates`: this process creates servers. What the credential
        could do beyond `roles` is kept in `excess`."""
        if self._read_scope is None:
            raise PermanentProviderError("the credential's scope cannot be read")
        scope = self._read_scope()
        self.guard.owned = ownership(scope, projects, creates)
        self.scope = scope
        self.excess = excess(scope, roles)
        return scope

    def discover(self) -> None:
        """Resolve flavors, aggregates and the image; raise RegionError naming
        everything missing, or a ProviderError if the cloud cannot be asked."""
        listed = self._all("compute", "/flavors/detail", "flavors")
        flavors = {f.name: f for f in (read(Flavor, r, "compute flavor") for r in listed)}
        answer = self.client.get("compute", "/os-aggregates")
        aggregates = {
            a.name: a for a in read(Aggregates, answer, "compute GET /os-aggregates").aggregates
        }
        problems: list[str] = []
        resolved: dict[PoolId, ResolvedPool] = {}
        for spec in self.region.pools:
            pool = self.region.domain_pool(spec)
            flavor = flavors.get(spec.flavor)
            aggregate = aggregates.get(spec.aggregate_name)
            if flavor is None:
                problems.append(f"flavor {spec.flavor!r} (pool {pool.id}) does not exist")
            if aggregate is None:
                problems.append(
                    f"host aggregate {spec.aggregate_name!r} (pool {pool.id}) does not exist"
                )
            elif aggregate.availability_zone not in (spec.zone, None):
                problems.append(
                    f"aggregate {spec.aggregate_name!r} is in zone "
                    f"{aggregate.availability_zone!r}, not {spec.zone!r}"
                )
            if flavor is None or aggregate is None:
                continue
            try:
                request = flavor_request(
                    flavor.vcpus, flavor.ram, flavor.disk or 0, flavor.extra_specs or {}
                )
            except ValueError as e:
                problems.append(f"flavor {spec.flavor!r}: {e}")
                continue
            request = placement.as_nova_schedules(request)
            resolved[pool.id] = ResolvedPool(
                pool, spec, flavor.id, flavor.vcpus, flavor.ram, request, aggregate.uuid
            )
        image = self._image()
        if image is None:
            problems.append(f"image {self.region.image!r} does not exist")
        if problems:
            raise RegionError("; ".join(problems))
        self._pools = resolved
        self._image_id = image or ""

    def _image(self) -> str | None:
        wanted = self.region.image
        by_id = self.client.get("image", f"/images/{wanted}") if _looks_like_id(wanted) else None
        if by_id:
            return read(Image, by_id, f"image GET /images/{wanted}").id
        answer = self.client.get("image", "/images", {"name": wanted})
        found = read(Images, answer, "image GET /images").images
        return found[0].id if found else None

    def _all(
        self, service: str, path: str, key: str, page_size: int = _PAGE, **params: str
    ) -> Records:
        """Every page of a Nova list."""
        out: Records = []
        marker = ""
        while True:
            query = dict(params, limit=str(page_size))
            if marker:
                query["marker"] = marker
            records = page(self.client.get(service, path, query), key, f"{service} GET {path}")
            out.extend(records)
            if len(records) < page_size:
                return out
            marker = str(records[-1].get("id") or "")
            if not marker:
                raise MalformedAnswer(f"{service} GET {path}: a full page ends without an id")

    def _servers(self, **params: str) -> Records:
        """Servers in pages of `list_page_size`: for each page Nova asks Neutron for
        the ports of all its servers by id in one URL, and Neutron refuses a URL
        longer than its request-line limit (4 KiB under gunicorn's defaults)."""
        owned = self.guard.owned
        if owned is not None and owned.beyond_credential:
            params["all_tenants"] = "1"  # sco's other projects (an admin credential)
        return self._all(
            "compute", "/servers/detail", "servers", self.region.list_page_size, **params
        )

    # ------------------------------------------------------------ headroom

    def refresh(self) -> HeadroomCache:
        """Read headroom of every pool from Placement, and the compute quota. One
        call per distinct (flavor request, aggregate); pools sharing both share it."""
        started = time.monotonic()
        wants = [Want(p, rp.request, rp.aggregate_uuid) for p, rp in self._pools.items()]
        found = self._placement.rooms(wants)
        calls = self._placement.calls
        rooms = {str(k): v for k, v in found.items()}
        answer = self.client.get("compute", "/limits")
        limits = read(LimitsAnswer, answer, "compute GET /limits").limits.absolute
        cache = HeadroomCache(
            at=self.clock.now(),
            rooms=rooms,
            quota=QuotaRoom.from_limits(limits.model_dump(by_alias=True)),
            took_s=time.monotonic() - started,
            calls=calls + 1,
        )
        with self._lock:
            self._cache = cache
        return cache

    def start_refresher(self) -> None:
        """Refresh headroom every `headroom_ttl_s` in a background thread."""
        if self._refresher is not None:
            return
        self._refresher = threading.Thread(
            target=self._refresh_loop, name="sco-headroom", daemon=True
        )
        self._refresher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(timeout=self.region.api_timeout_s + 5)
            self._refresher = None

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self.last_refresh_error = ""
            except ProviderError as e:
                self.last_refresh_error = str(e)
                log.warning("headroom refresh failed: %s", e)
            self._stop.wait(self.region.headroom_ttl_s)

    def headroom_age(self) -> float | None:
        with self._lock:
            cache = self._cache
        return None if cache is None else self.clock.now() - cache.at

    def degraded(self) -> str:
        """Why this provider cannot be trusted now, or ""."""
        reasons = [
            f"{g.name} circuit {g.breaker.state}"
            for g in self.client.guards.values()
            if g.breaker.state != "closed"
        ]
        age = self.headroom_age()
        if age is None or age > self.region.headroom_stale_s:
            reasons.append("headroom unknown" if age is None else f"headroom {age:.0f} s old")
        return ", ".join(reasons)

    # ------------------------------------------------------------ Provider port

    def pools(self) -> Sequence[Pool]:
        return [rp.pool for rp in self._pools.values()] or self.region.domain_pools()

    def headroom(self, pools: Sequence[PoolId]) -> Mapping[PoolId, int]:
        with self._lock:
            cache = self._cache
        if cache is None or self.clock.now() - cache.at > self.region.headroom_stale_s:
            return dict.fromkeys(pools, 0)
        return {p: cache.rooms.get(p, 0) for p in pools}

    def prices(self, pools: Sequence[PoolId]) -> Mapping[PoolId, float]:
        return {p: self._pools[p].pool.price_per_h for p in pools if p in self._pools}

    def list(self, partition: str) -> Sequence[ServerView]:
        listed = self._servers(tags=partition_tag(partition))
        records = self.guard.mine(self.guard.ours(listed, partition))
        now = self.clock.now()
        live = [
            s
            for s in records
            if s.get("OS-EXT-STS:task_state") != "deleting"
            and not self._tombstones.hides(str(s.get("id", "")), now)
        ]
        listing = server_views(live, partition)
        for bad in listing.unreadable:
            log.warning("server %s tagged for %s ignored: %s", bad.server_id, partition, bad.why)
        self._last_listing[partition] = listing.views
        return listing.views

    def last_listing(self, partition: str) -> Sequence[ServerView]:
        return self._last_listing.get(partition, ())

    def delete(self, server_ids: Sequence[str]) -> None:
        """Delete sco's servers among `server_ids`; foreign ones are refused
        (ForeignServer, once the rest are deleted)."""
        ours, refused = self.guard.refuse_foreign(server_ids, "delete")
        failed: Ids = []
        for sid in ours:
            try:
                self.client.delete("compute", f"/servers/{sid}")
            except RetryableProviderError as e:
                failed.append(sid)
                log.warning("delete %s failed: %s", sid, e)
                continue
            self._tombstones.add([sid], self.clock.now())
        if failed:
            raise RetryableProviderError(f"delete failed for {len(failed)} of {len(server_ids)}")
        if refused:
            raise ForeignServer(f"refused to delete {len(refused)} servers outside sco's projects")

    # ------------------------------------------------------------ the reclaimer's side

    def all_servers(self) -> Sequence[ServerView]:
        """Every server sco tagged, of every partition (what a reclaimer chooses from)."""
        by_partition: dict[str, list[Mapping[str, Any]]] = {}
        for s in self.guard.ours(self._servers(tags=TAG), "*"):
            if s.get("OS-EXT-STS:task_state") == "deleting":
                continue
            meta = s.get("metadata")
            partition = meta.get(META_PARTITION, "") if isinstance(meta, dict) else ""
            by_partition.setdefault(str(partition), []).append(s)
        return [v for p, records in by_partition.items() for v in server_views(records, p).views]

    def give_notice(self, server_id: str, deadline: float) -> float:
        """The reclaim-notice contract: the server goes at `deadline`. A notice never
        moves: a server already noticed keeps its deadline, which is returned; one
        whose notice is not a time is refused (UnreadableNotice), as is a foreign
        server (ForeignServer)."""
        self.guard.own_only(server_id, "give notice to")
        path = f"/servers/{server_id}/metadata"
        answer = self.client.get("compute", path)
        meta = read(Metadata, answer, f"compute GET {path}").metadata
        in_force = notice_in_force(server_id, meta.get(META_RECLAIM_AT))
        if in_force is not None:
            return in_force
        path = f"/servers/{server_id}/metadata/{META_RECLAIM_AT}"
        self.client.put("compute", path, {"meta": {META_RECLAIM_AT: f"{deadline:.0f}"}})
        return deadline

    def deliver_token(self, server_id: str, token: Secret) -> None:
        """The node's token in its server's metadata (`sco:node-token`), which the
        node reads from the metadata service. A foreign server is refused
        (ForeignServer): a token never reaches another project's server."""
        self.guard.own_only(server_id, "hand a node token to")
        path = f"/servers/{server_id}/metadata/{META_NODE_TOKEN}"
        self.client.put("compute", path, {"meta": {META_NODE_TOKEN: token.reveal()}})

    def create(
        self, pool: PoolId, count: int, request_id: str, partition: str, plan_generation: int
    ) -> CreateResult:
        """Send the request and return at once (`pending`): its servers are listed by
        request id once Nova has them, refused ones marked so. A request id whose
        servers exist is never sent again. The compute quota caps `count`; none left
        raises QuotaExceeded before anything is sent. A POST that times out is an
        unknown outcome (RetryableProviderError): the listing tells."""
        rp = self._pools.get(pool)
        if rp is None:
            raise PermanentProviderError(f"unknown pool {pool}")
        existing = self._servers_of(request_id)
        if existing:
            log.info(
                "request %s already has %d servers; not sending it again", request_id, len(existing)
            )
            return CreateResult(tuple(str(s["id"]) for s in existing))
        wanted, count = count, self._within_quota(rp, count)
        body = {
            "server": {
                "name": f"sco-{partition}-{request_id}"[:255],
                "flavorRef": rp.flavor_id,
                "imageRef": self._image_id,
                "availability_zone": rp.spec.zone,
                "networks": self.region.network,
                "min_count": count,
                "max_count": count,
                "return_reservation_id": True,
                "tags": server_tags(partition, request_id, self.installation),
                "metadata": server_metadata(
                    partition,
                    rp.pool.id,
                    rp.pool.capacity_class.value,
                    request_id,
                    plan_generation,
                    self.installation,
                ),
            }
        }
        if self.region.user_data:
            body["server"]["user_data"] = base64.b64encode(self.region.user_data.encode()).decode()
        # A timeout here may have taken effect: the request tag tells on the next listing.
        answer = self.client.post("compute", "/servers", body)
        # Unreadable, it may still have taken effect: retryable, and the listing tells.
        read(Created, answer, "compute POST /servers (its outcome unknown)")
        short = f"the compute quota leaves room for {count} of {wanted}" if count < wanted else ""
        return CreateResult((), short, pending=count)

    # ------------------------------------------------------------ create helpers

    def _within_quota(self, rp: ResolvedPool, count: int) -> int:
        with self._lock:
            cache = self._cache
        if cache is None:
            return count
        room = cache.quota.servers(rp.vcpus, rp.ram_mb)
        if room is None:
            return count
        if room <= 0:
            raise QuotaExceeded(f"compute quota leaves no room for {rp.spec.flavor}")
        with self._lock:
            if self._cache is cache:
                spent = min(count, room)
                self._cache = dataclasses.replace(
                    cache, quota=cache.quota.spend(spent, rp.vcpus, rp.ram_mb)
                )
        return min(count, room)

    def _servers_of(self, request_id: str) -> Records:
        listed = self._servers(tags=request_tag(request_id))
        servers = self.guard.mine(self.guard.ours(listed, None))
        return [s for s in servers if s.get("OS-EXT-STS:task_state") != "deleting"]


def _looks_like_id(text: str) -> bool:
    hexes = text.replace("-", "")
    return len(hexes) == 32 and all(c in "0123456789abcdef" for c in hexes.lower())
