"""Pure translations between Nova/Placement data and sco's terms.

Nothing here does I/O: flavors become Placement resource requests, provider
summaries become headroom, compute limits become quota room, and Nova's
server records become `ServerView`s. The adapter does the calls around them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import PoolId
from sco.ports import PermanentProviderError, ServerStatus, ServerView

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tags and metadata
# Nova tags (API 2.26+) are at most 60 characters and may not hold "/" or ",";
# the partition and request id go in tags so listing can filter on them, and
# everything else (the pool id has "/") in metadata.

TAG = "sco"
PARTITION_TAG = "sco:p="
REQUEST_TAG = "sco:r="
# Which sco installation a server is: two may share a project (and a partition name).
# A server with no such tag is the default installation's (sco before it had one).
INSTALLATION_TAG = "sco:i="
META_PARTITION = "sco:partition"
META_POOL = "sco:pool"
META_CLASS = "sco:class"
META_REQUEST = "sco:request"
META_GENERATION = "sco:generation"
META_INSTALLATION = "sco:installation"
# The reclaim-notice contract: a reclaimer that wants a spot server back sets this
# metadata key to the deadline (seconds since the epoch, or ISO 8601 with a zone).
META_RECLAIM_AT = "sco:reclaim-at"
# The node's token for the contract distributor: the server reads it from its metadata.
META_NODE_TOKEN = "sco:node-token"

_MAX_TAG = 60


def partition_tag(partition: str) -> str:
    return _tag(PARTITION_TAG, partition)


def request_tag(request_id: str) -> str:
    return _tag(REQUEST_TAG, request_id)


def _tag(prefix: str, value: str) -> str:
    tag = prefix + value
    if len(tag) > _MAX_TAG or "/" in tag or "," in tag:
        raise ValueError(f"{value!r} cannot be a Nova tag (at most 54 characters, no '/' or ',')")
    return tag


def server_tags(
    partition: str, request_id: str, installation: str = DEFAULT_INSTALLATION
) -> list[str]:
    return [
        TAG,
        partition_tag(partition),
        request_tag(request_id),
        _tag(INSTALLATION_TAG, installation),
    ]


def installation_of(server: Mapping[str, object]) -> str | None:
    """The installation a Nova server record is tagged for (None: no such tag)."""
    tags = server.get("tags")
    if isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, str) and tag.startswith(INSTALLATION_TAG):
                return tag[len(INSTALLATION_TAG) :]
    return None


def server_metadata(
    partition: str,
    pool: PoolId,
    capacity_class: str,
    request_id: str,
    plan_generation: int,
    installation: str = DEFAULT_INSTALLATION,
) -> dict[str, str]:
    """What the node reads of itself (its scheduler's features and labels follow)."""
    return {
        META_PARTITION: partition,
        META_POOL: pool,
        META_CLASS: capacity_class,
        META_REQUEST: request_id,
        META_GENERATION: str(plan_generation),
        META_INSTALLATION: installation,
    }


# ---------------------------------------------------------------- flavors -> requests


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """What one server of a flavor takes from Placement: amounts and trait rules."""

    resources: Mapping[str, int]
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()

    def query(self, member_of: str | None = None) -> dict[str, str]:
        """Query parameters of `GET /allocation_candidates` for one such server."""
        params = {"resources": ",".join(f"{rc}:{n}" for rc, n in sorted(self.resources.items()))}
        traits = sorted(self.required) + [f"!{t}" for t in sorted(self.forbidden)]
        if traits:
            params["required"] = ",".join(traits)
        if member_of:
            params["member_of"] = member_of
        return params


def flavor_request(
    vcpus: int, ram_mb: int, disk_gb: int, extra_specs: Mapping[str, str]
) -> ResourceRequest:
    """Nova's own translation of a flavor into a Placement request, for the
    unnumbered group: `resources:RC=N` overrides or adds an amount (0 drops it, as
    Ironic flavors do with VCPU/MEMORY_MB/DISK_GB), `trait:T=required|forbidden`
    adds a trait rule. Numbered groups (`resources1:`) are not supported."""
    amounts: dict[str, int] = {"VCPU": vcpus, "MEMORY_MB": ram_mb, "DISK_GB": disk_gb}
    required: set[str] = set()
    forbidden: set[str] = set()
    for key, value in extra_specs.items():
        head, _, name = key.partition(":")
        if head == "resources" and name:
            try:
                amounts[name] = int(value)
            except ValueError:
                raise ValueError(f"flavor extra spec {key}={value!r} is not a count") from None
        elif head.startswith("resources") and head[9:].isdigit():
            raise ValueError(f"flavor extra spec {key}: numbered request groups are not supported")
        elif head == "trait" and name:
            if value == "required":
                required.add(name)
            elif value == "forbidden":
                forbidden.add(name)
    resources = {rc: n for rc, n in amounts.items() if n > 0}
    if not resources:
        raise ValueError("flavor requests no resources")
    return ResourceRequest(resources, frozenset(required), frozenset(forbidden))


# ---------------------------------------------------------------- headroom


def headroom_from_summaries(
    summaries: Mapping[str, Mapping[str, object]], request: ResourceRequest
) -> int:
    """Servers of `request` that still fit, summed over the providers of an
    `/allocation_candidates` answer (microversion >= 1.27: capacity and used per
    resource class). A server lands on one provider, so each provider counts the
    whole servers it can hold."""
    total = 0
    for summary in summaries.values():
        resources = summary.get("resources")
        if not isinstance(resources, Mapping):
            continue
        total += _fits(resources, request.resources)
    return total


def _fits(resources: Mapping[str, object], wanted: Mapping[str, int]) -> int:
    fits = math.inf
    for rc, amount in wanted.items():
        row = resources.get(rc)
        if not isinstance(row, Mapping):
            return 0
        free = int(row.get("capacity", 0)) - int(row.get("used", 0))
        fits = min(fits, max(free, 0) // amount)
    return 0 if fits is math.inf else int(fits)


# ---------------------------------------------------------------- quota


@dataclass(frozen=True, slots=True)
class QuotaRoom:
    """What the project may still create, from `GET /limits`; None: unlimited."""

    instances: int | None = None
    cores: int | None = None
    ram_mb: int | None = None

    @classmethod
    def from_limits(cls, absolute: Mapping[str, object]) -> QuotaRoom:
        def room(limit_key: str, used_key: str) -> int | None:
            limit = _int(absolute.get(limit_key), -1)
            if limit < 0:
                return None
            return max(limit - _int(absolute.get(used_key), 0), 0)

        return cls(
            instances=room("maxTotalInstances", "totalInstancesUsed"),
            cores=room("maxTotalCores", "totalCoresUsed"),
            ram_mb=room("maxTotalRAMSize", "totalRAMUsed"),
        )

    def servers(self, vcpus: int, ram_mb: int) -> int | None:
        """How many servers of this size still fit the quota; None: no limit."""
        bounds = [self.instances]
        if self.cores is not None and vcpus > 0:
            bounds.append(self.cores // vcpus)
        if self.ram_mb is not None and ram_mb > 0:
            bounds.append(self.ram_mb // ram_mb)
        known = [b for b in bounds if b is not None]
        return min(known) if known else None

    def spend(self, servers: int, vcpus: int, ram_mb: int) -> QuotaRoom:
        def less(room: int | None, n: int) -> int | None:
            return None if room is None else max(room - n, 0)

        return QuotaRoom(
            less(self.instances, servers),
            less(self.cores, servers * vcpus),
            less(self.ram_mb, servers * ram_mb),
        )


def _int(value: object, default: int) -> int:
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return default


# ---------------------------------------------------------------- servers -> views

# What each Nova status means to sco. A server that is stopped, shelved or
# suspended holds no capacity for its partition, so it counts as failed and is
# replaced; DELETED and SOFT_DELETED are gone (absent from the view).
_STATUS: Mapping[str, ServerStatus | None] = {
    "BUILD": ServerStatus.BUILD,
    "ACTIVE": ServerStatus.ACTIVE,
    "REBOOT": ServerStatus.ACTIVE,
    "HARD_REBOOT": ServerStatus.ACTIVE,
    "PASSWORD": ServerStatus.ACTIVE,
    "MIGRATING": ServerStatus.ACTIVE,
    "RESIZE": ServerStatus.ACTIVE,
    "VERIFY_RESIZE": ServerStatus.ACTIVE,
    "REVERT_RESIZE": ServerStatus.ACTIVE,
    "REBUILD": ServerStatus.BUILD,
    "ERROR": ServerStatus.ERROR,
    "SHUTOFF": ServerStatus.ERROR,
    "STOPPED": ServerStatus.ERROR,
    "PAUSED": ServerStatus.ERROR,
    "SUSPENDED": ServerStatus.ERROR,
    "SHELVED": ServerStatus.ERROR,
    "SHELVED_OFFLOADED": ServerStatus.ERROR,
    "RESCUE": ServerStatus.ERROR,
    "UNKNOWN": ServerStatus.ERROR,
    "DELETED": None,
    "SOFT_DELETED": None,
}


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A tagged server whose sco metadata could not be read, and why."""

    server_id: str
    why: str


@dataclass(frozen=True, slots=True)
class Listing:
    views: tuple[ServerView, ...] = ()
    unreadable: tuple[Unreadable, ...] = field(default=())


def server_views(servers: Iterable[Mapping[str, object]], partition: str) -> Listing:
    """The partition's servers from `GET /servers/detail` records, skipping
    deleted ones. A record without sco's metadata is reported, not guessed at."""
    views: list[ServerView] = []
    bad: list[Unreadable] = []
    for server in servers:
        sid = str(server.get("id", ""))
        try:
            view = _view(server, partition)
        except ValueError as e:
            bad.append(Unreadable(sid, str(e)))
            continue
        if view is not None:
            views.append(view)
    return Listing(tuple(views), tuple(bad))


def _view(server: Mapping[str, object], partition: str) -> ServerView | None:
    sid = server.get("id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("no id")
    status = str(server.get("status", "UNKNOWN")).upper()
    mapped = _STATUS.get(status, ServerStatus.ERROR)
    if mapped is None:
        return None
    meta = server.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("no metadata")
    if meta.get(META_PARTITION) != partition:
        raise ValueError(f"metadata names partition {meta.get(META_PARTITION)!r}")
    for key in (META_POOL, META_REQUEST):
        if not meta.get(key):
            raise ValueError(f"metadata lacks {key}")
    fault = ""
    if mapped is ServerStatus.ERROR:
        fault = _fault(server, status)
    raw = meta.get(META_RECLAIM_AT)
    unreadable = ""
    try:
        deadline = read_deadline(raw)
    except ValueError:
        # Not a deadline: no notice is in force, as `sco reclaim --sweep` reads it too.
        # A typo must not drain the server, requeue its work and delete it; the value
        # is kept so that it is reported until someone fixes it.
        deadline, unreadable = None, str(raw)
        log.warning("server %s: %s=%r is not a deadline: no notice in force",
                    sid, META_RECLAIM_AT, unreadable)  # fmt: skip
    return ServerView(
        server_id=sid,
        partition=partition,
        pool=str(meta[META_POOL]),
        request_id=str(meta[META_REQUEST]),
        plan_generation=_int(meta.get(META_GENERATION), 0),
        status=mapped,
        created_at=parse_time(str(server.get("created", ""))),
        notice_deadline=deadline,
        notice_unreadable=unreadable,
        fault=fault,
        active_at=_launched(server.get("OS-SRV-USG:launched_at")),
        refused=mapped is ServerStatus.ERROR and is_no_valid_host(server),
        token_missing=not meta.get(META_NODE_TOKEN),
    )


def _launched(value: object) -> float | None:
    """Nova's `launched_at`: when the server first became ACTIVE (null before)."""
    if not value:
        return None
    try:
        return parse_time(str(value))
    except ValueError:
        return None


def _fault(server: Mapping[str, object], status: str) -> str:
    fault = server.get("fault")
    if isinstance(fault, Mapping) and fault.get("message"):
        return f"{status}: {fault['message']}"
    return f"server {status}"


def read_deadline(value: object) -> float | None:
    """A `sco:reclaim-at` value as a time: None when unset; ValueError when it holds
    something that is not a finite time (epoch seconds, or ISO 8601 with a zone)."""
    if value is None or value == "":
        return None
    text = str(value)
    try:
        at = float(text)
    except ValueError:
        at = parse_time(text)
    if not math.isfinite(at):
        raise ValueError(f"{text!r} is at no finite time")
    return at


class UnreadableNotice(PermanentProviderError):
    """A server's notice holds a value that is not a time: no deadline is in force,
    and none is guessed (a person must look)."""


def notice_in_force(server_id: str, value: object) -> float | None:
    """The deadline a server's existing notice sets; UnreadableNotice if it cannot
    be read, so that nobody acts on a deadline the value does not say."""
    try:
        return read_deadline(value)
    except ValueError:
        raise UnreadableNotice(
            f"server {server_id}: {META_RECLAIM_AT}={value!r} is not a deadline"
        ) from None


def parse_time(text: str) -> float:
    """Nova's timestamps: ISO 8601, `Z` or an offset; naive ones are UTC."""
    if not text:
        raise ValueError("no timestamp")
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def is_no_valid_host(server: Mapping[str, object]) -> bool:
    fault = server.get("fault")
    message = str(fault.get("message", "")) if isinstance(fault, Mapping) else ""
    return "No valid host" in message or "NoValidHost" in message
