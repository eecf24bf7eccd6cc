"""The provider port's rules (`sco.ports.Provider`), once, over every implementation:

- "nova": `OpenStackProvider` on the Nova test stack (nova-api, scheduler, conductor
  and fake computes, real Placement: the session's shared stack, two halls of two
  computes with four spot slots each);
- "sim": the lab's simulated region (`SimRegion`, trace-driven), each installation
  through the lab's own view of it (`sco.lab.swarm.world.Tenant`).

Both are held to what the controller relies on: pools with ids, classes and prices;
headroom a count for every pool, that creates spend; every server tagged (partition,
pool, request id, plan generation) and listed by partition, for its installation
only; deletes that remove, and a delete of what is gone that is no error; a create
asking more than fits answers fewer (a shortfall), servers listed as refused, or
InsufficientCapacity, never a generic error; a wrong request the typed
PermanentProviderError.

Where the two legitimately differ the rule takes both: the real cloud is
asynchronous (a create answers `pending` and its servers are listed later, Nova
places all of a batch or none, headroom is Placement's, read in the background by
`refresh`), the region answers at once on its own clock. Every rule waits for what
it expects (`eventually`), a few minutes at most on the cloud; nothing is asserted
of how long anything took. The cloud's servers are deleted after every rule.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from sco.adapters.openstack import CloudsYamlSecrets, open_provider
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.provider import OpenStackProvider
from sco.domain.installation import DEFAULT_INSTALLATION
from sco.domain.pools import CapacityClass, PoolId
from sco.engine.clock import SystemClock
from sco.lab.region import SimConfig, SimRegion
from sco.lab.swarm.world import Tenant
from sco.lab.traces import load_traces
from sco.ports import (
    CreateResult,
    InsufficientCapacity,
    PermanentProviderError,
    Provider,
    Secret,
    ServerStatus,
    ServerView,
)
from sco_harness.builders import write_json_trace, write_yaml
from sco_harness.openstack_stack import NovaStack, region_spec

T = TypeVar("T")

ROOM = 8  # servers the spot pool under test holds: 2 computes x 4 slots, or its trace
CLOUD = "sco-test"
_requests = itertools.count(1)


@dataclass
class Cloud:
    """A provider of each installation on one cloud, and the cloud's clock."""

    open: Callable[[str], Provider]  # the provider of an installation
    spot: PoolId  # a spot pool with room for ROOM servers
    gone: str  # the id a server of this cloud might have had, and does not
    tick: Callable[[], None]  # time passes (the cloud's headroom read again)
    now: Callable[[], float]
    patience_s: float  # how long an answer may take to show
    deliver: Callable[[str, Secret], None]  # a node token into the server's metadata
    providers: dict[str, Provider] = field(default_factory=dict)

    def provider(self, installation: str = DEFAULT_INSTALLATION) -> Provider:
        if installation not in self.providers:
            self.providers[installation] = self.open(installation)
        return self.providers[installation]


def eventually(cloud: Cloud, check: Callable[[], T | None], what: str) -> T:
    """`check`'s answer once it has one (not None, not empty, not false)."""
    deadline = cloud.now() + cloud.patience_s
    while True:
        got = check()
        if got:
            return got
        if cloud.now() > deadline:
            raise AssertionError(f"{what}: not seen in {cloud.patience_s:.0f} s")
        cloud.tick()


# ---------------------------------------------------------------- implementations


def _nova(request: pytest.FixtureRequest) -> Iterator[Cloud]:
    stack: NovaStack = request.getfixturevalue("stack")
    region = RegionSpec.model_validate(region_spec(list(stack.halls)))
    opened: list[OpenStackProvider] = []

    def open_(installation: str) -> Provider:
        provider = open_provider(region, CLOUD, CloudsYamlSecrets(), SystemClock(),
                                 str(stack.clouds_yaml), installation)  # fmt: skip
        provider.discover()
        provider.refresh()
        opened.append(provider)
        return provider

    def tick() -> None:
        time.sleep(0.5)
        for provider in opened:
            provider.refresh()  # Placement read again, as the background refresher does

    def deliver(server_id: str, token: Secret) -> None:
        opened[0].deliver_token(server_id, token)  # a rule opens its provider first

    yield Cloud(open_, "lab/hall-a/spot.small", str(uuid.uuid4()), tick, time.monotonic,
                patience_s=180.0, deliver=deliver)  # fmt: skip
    stack.clear()  # every server of the rule deleted, Placement empty again


def _sim(request: pytest.FixtureRequest) -> Iterator[Cloud]:
    folder: Path = request.getfixturevalue("tmp_path")
    for series in ("a", "b"):
        write_json_trace(folder, series, [ROOM] * 4, gap_s=3600)
    write_yaml(folder / "region.yaml", {"name": "lab", "halls": 2,
                                        "guaranteed_quota_per_hall": 16})  # fmt: skip
    region = SimRegion(load_traces(folder), SimConfig(api_latency_s=1.0, cold_start_s=30.0))
    (spot,) = [p.id for p in region.pools() if p.aggregate == "a"]

    def tick() -> None:
        region.advance_to(region.now + 1.0)

    yield Cloud(lambda installation: Tenant(region, installation), spot, "srv-9999999", tick,
                lambda: region.now, patience_s=600.0, deliver=region.deliver_token)  # fmt: skip


IMPLEMENTATIONS = {"nova": _nova, "sim": _sim}


@pytest.fixture(params=list(IMPLEMENTATIONS))
def cloud(request: pytest.FixtureRequest) -> Iterator[Cloud]:
    yield from IMPLEMENTATIONS[request.param](request)


# ---------------------------------------------------------------- helpers


def _request() -> str:
    return f"req-{next(_requests)}-{uuid.uuid4().hex[:8]}"


def _partition(name: str) -> str:
    """A partition of this rule's own (the cloud keeps other rules' servers a while)."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def _of(provider: Provider, partition: str, request_id: str) -> list[ServerView]:
    return [v for v in provider.list(partition) if v.request_id == request_id]


def _listed(
    cloud: Cloud, provider: Provider, partition: str, request_id: str, count: int
) -> list[ServerView]:
    """The request's `count` servers once all are listed and none is building."""

    def done() -> list[ServerView] | None:
        views = _of(provider, partition, request_id)
        settled = all(v.status is not ServerStatus.BUILD for v in views)
        return views if len(views) == count and settled else None

    return eventually(cloud, done, f"{count} servers of {request_id} listed, built or refused")


def _one(cloud: Cloud, listing: Callable[[], Sequence[ServerView]], what: str) -> ServerView:
    """The one server a listing shows, once it shows one."""

    def one() -> ServerView | None:
        views = listing()
        return views[0] if len(views) == 1 else None

    return eventually(cloud, one, what)


def _sent(result: CreateResult) -> int:
    """Servers the create took: accepted now, or pending (listed later)."""
    return len(result.server_ids) + result.pending


def _create(
    provider: Provider, pool: PoolId, count: int, request_id: str, partition: str
) -> CreateResult | InsufficientCapacity:
    """The create's answer, or the InsufficientCapacity it raised (any other error
    fails the rule)."""
    try:
        return provider.create(pool, count, request_id, partition, 1)
    except InsufficientCapacity as e:
        return e


def _room(cloud: Cloud, provider: Provider, pool: PoolId, want: int) -> None:
    """Once the pool's headroom is `want` (the cloud's is read in the background)."""
    eventually(cloud, lambda: provider.headroom([pool])[pool] == want, f"room for {want}")


# ---------------------------------------------------------------- pools and headroom


def test_pools_have_ids_classes_and_prices(cloud: Cloud) -> None:
    provider = cloud.provider()
    pools = provider.pools()
    ids = [p.id for p in pools]
    assert len(set(ids)) == len(ids), "one pool an id"
    assert cloud.spot in ids
    assert {p.capacity_class for p in pools} == {CapacityClass.SPOT, CapacityClass.GUARANTEED}
    assert len({p.region for p in pools}) == 1, "one region"
    for p in pools:
        assert p.id.startswith(f"{p.region}/{p.hall}/{p.flavor}")
        assert p.units_per_instance >= 1
    prices = provider.prices(ids)
    assert prices == {p.id: p.price_per_h for p in pools}
    assert all(price >= 0 for price in prices.values())


def test_headroom_is_a_count_for_every_pool_and_none_for_a_pool_it_has_not(
    cloud: Cloud,
) -> None:
    provider = cloud.provider()
    ids = [p.id for p in provider.pools()]
    room = provider.headroom([*ids, "lab/nowhere/none"])
    for pool in ids:
        assert isinstance(room[pool], int)
        assert room[pool] >= 0
    assert room.get("lab/nowhere/none", 0) == 0
    _room(cloud, provider, cloud.spot, ROOM)


# ---------------------------------------------------------------- create, list, delete


def test_every_server_is_tagged_and_listed_and_creates_spend_headroom(cloud: Cloud) -> None:
    provider = cloud.provider()
    _room(cloud, provider, cloud.spot, ROOM)
    partition, request_id = _partition("tags"), _request()
    result = provider.create(cloud.spot, 3, request_id, partition, 7)
    assert _sent(result) == 3
    assert result.shortfall_reason == ""
    views = _listed(cloud, provider, partition, request_id, 3)
    assert {(v.partition, v.pool, v.request_id, v.plan_generation) for v in views} == {
        (partition, cloud.spot, request_id, 7)
    }
    assert set(result.server_ids) <= {v.server_id for v in views}
    assert len({v.server_id for v in views}) == 3
    assert all(v.status is ServerStatus.ACTIVE and not v.refused for v in views)
    eventually(cloud, lambda: provider.headroom([cloud.spot])[cloud.spot] <= ROOM - 3,
               "headroom spent")  # fmt: skip
    assert not provider.list(_partition("other"))


def test_a_listing_says_whether_the_node_token_is_on_the_server(cloud: Cloud) -> None:
    """Missing until it is delivered, then there: a token another write to the
    server's metadata took is handed over again (sco.engine.tokens)."""
    provider = cloud.provider()
    partition, request_id = _partition("token"), _request()
    assert _sent(provider.create(cloud.spot, 1, request_id, partition, 1)) == 1
    (view,) = _listed(cloud, provider, partition, request_id, 1)
    assert view.token_missing
    cloud.deliver(view.server_id, Secret("t0k3n"))
    eventually(
        cloud,
        lambda: not _of(provider, partition, request_id)[0].token_missing,
        "the token shown on its server",
    )


def test_a_listing_is_its_partition_s_servers_of_its_installation(cloud: Cloud) -> None:
    """Two installations share the project (and a partition name): each lists its own.
    The default installation's listing has neither."""
    blue, green = cloud.provider("blue"), cloud.provider("green")
    p1, p2 = _partition("p1"), _partition("p2")
    made = {
        ("blue", p1): blue.create(cloud.spot, 1, _request(), p1, 1),
        ("blue", p2): blue.create(cloud.spot, 1, _request(), p2, 1),
        ("green", p1): green.create(cloud.spot, 1, _request(), p1, 1),
    }
    assert all(_sent(r) == 1 for r in made.values())
    listing: dict[tuple[str, str], Callable[[], Sequence[ServerView]]] = {
        ("blue", p1): lambda: blue.list(p1),
        ("blue", p2): lambda: blue.list(p2),
        ("green", p1): lambda: green.list(p1),
    }
    ids = {key: _one(cloud, list_, str(key)) for key, list_ in listing.items()}
    assert len({v.server_id for v in ids.values()}) == 3, "three servers, each listed once"
    assert len({v.request_id for v in ids.values()}) == 3
    for key, list_ in listing.items():
        assert [v.server_id for v in list_()] == [ids[key].server_id], key
    assert not cloud.provider().list(p1)


def test_delete_removes_servers_and_a_server_gone_is_no_error(cloud: Cloud) -> None:
    provider = cloud.provider()
    partition, request_id = _partition("del"), _request()
    provider.create(cloud.spot, 2, request_id, partition, 1)
    a, b = (v.server_id for v in _listed(cloud, provider, partition, request_id, 2))
    provider.delete([a])
    eventually(cloud, lambda: [v.server_id for v in provider.list(partition)] == [b], "a gone")
    provider.delete([a])  # already gone
    provider.delete([cloud.gone])  # never was
    provider.delete([a, b])
    eventually(cloud, lambda: not provider.list(partition), "both gone")
    _room(cloud, provider, cloud.spot, ROOM)


# ---------------------------------------------------------------- more than fits


def test_asking_more_than_fits_answers_fewer_refused_or_insufficient_capacity(
    cloud: Cloud,
) -> None:
    provider = cloud.provider()
    _room(cloud, provider, cloud.spot, ROOM)
    partition, request_id = _partition("over"), _request()
    result = _create(provider, cloud.spot, ROOM + 4, request_id, partition)
    if isinstance(result, InsufficientCapacity):
        assert result.pool == cloud.spot
        return
    taken = _sent(result)
    assert taken <= ROOM + 4
    if taken < ROOM + 4:
        assert result.shortfall_reason, "fewer than asked says why"
    views = _listed(cloud, provider, partition, request_id, taken)
    placed = [v for v in views if not v.refused]
    assert len(placed) <= ROOM, "never more than fits"
    assert all(v.status is ServerStatus.ACTIVE for v in placed)
    assert all(v.status is ServerStatus.ERROR for v in views if v.refused)


def test_a_full_pool_answers_insufficient_capacity_or_refuses(cloud: Cloud) -> None:
    provider = cloud.provider()
    _room(cloud, provider, cloud.spot, ROOM)
    partition, request_id = _partition("full"), _request()
    assert _sent(provider.create(cloud.spot, ROOM, request_id, partition, 1)) == ROOM
    views = _listed(cloud, provider, partition, request_id, ROOM)
    assert not [v for v in views if v.refused]
    _room(cloud, provider, cloud.spot, 0)
    late = _request()
    result = _create(provider, cloud.spot, 1, late, partition)
    if isinstance(result, InsufficientCapacity):
        assert result.pool == cloud.spot
    else:
        (view,) = _listed(cloud, provider, partition, late, _sent(result))
        assert view.refused
        assert view.status is ServerStatus.ERROR
    assert provider.headroom([cloud.spot])[cloud.spot] == 0
    assert len([v for v in provider.list(partition) if not v.refused]) == ROOM


# ---------------------------------------------------------------- wrong requests


def test_a_pool_it_does_not_have_is_a_permanent_error(cloud: Cloud) -> None:
    with pytest.raises(PermanentProviderError):
        cloud.provider().create("lab/nowhere/none", 1, _request(), _partition("bad"), 1)


def test_a_create_of_no_server_is_a_permanent_error(cloud: Cloud) -> None:
    provider = cloud.provider()
    partition = _partition("none")
    with pytest.raises(PermanentProviderError):
        provider.create(cloud.spot, 0, _request(), partition, 1)
    assert not provider.list(partition)
