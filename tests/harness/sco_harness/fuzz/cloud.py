"""The answers of Nova, Placement and Glance, as the OpenStack adapter parses them.

A case is one cloud: for each request the adapter makes, the answer it gets (status,
body), most often a real answer with a few things changed, at times not JSON, an
error status, or an empty body. The whole adapter runs on it, through its real
HTTP client (guards, breakers and retries, with the sleeps taken out): resolving
the region (`discover`), reading headroom and quota (`refresh`), listing a
partition and every server, creating, noticing and deleting.

The rules: each call returns, or raises a `ProviderError` (the controller's next
step follows from its type) or, for `discover`, a `RegionError` naming what is
missing. What it returns keeps the port's promises: headroom whole and not
negative; every view of the partition asked for, with its id, pool and request
id, a finite creation time and a notice deadline that is finite or none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from sco.adapters.openstack.client import CloudClient, RetryConfig
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.provider import OpenStackProvider, RegionError
from sco.adapters.openstack.resilience import GuardConfig
from sco.adapters.openstack.resources import server_metadata
from sco.engine.clock import ManualClock
from sco.ports import ProviderError, Secret, ServerView
from sco_harness.fuzz import Check, Judge, Target
from sco_harness.fuzz.values import JUNK, mutated

NOW = 1_764_000_000.0
REGION = RegionSpec.model_validate(
    {
        "region": "r1",
        "image": "cirros",
        "pools": [
            {"hall": "hall-a", "flavor": "spot.small", "class": "spot", "price_per_h": 0.1},
            {"hall": "hall-b", "flavor": "spot.small", "class": "spot", "price_per_h": 0.1,
             "aggregate": "agg-b"},
            {"hall": "hall-a", "flavor": "std.small", "class": "guaranteed", "price_per_h": 0.3},
        ],
    }
)  # fmt: skip
POOL = REGION.domain_pools()[0].id


def _server(sid: str, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": sid,
        "name": f"sco-p1-{sid}",
        "status": status,
        "tenant_id": "proj-sco",
        "created": "2026-11-29T10:00:00Z",
        "OS-EXT-STS:task_state": None,
        "OS-SRV-USG:launched_at": "2026-11-29T10:01:02.000000" if status == "ACTIVE" else None,
        "tags": ["sco", "sco:p=p1", "sco:r=req-1"],
        "metadata": server_metadata("p1", POOL, "spot", "req-1", 3),
    } | extra


SERVERS = [
    _server("s-1", "ACTIVE"),
    _server("s-2", "BUILD"),
    _server("s-3", "ERROR", fault={"message": "No valid host was found. ", "code": 500}),
    _server(
        "s-4",
        "ACTIVE",
        metadata=server_metadata("p1", POOL, "spot", "req-1", 3) | {"sco:reclaim-at": "1764000120"},
    ),
]

# (service, path) -> a real answer. Paths with an id end in "/*".
ANSWERS: dict[tuple[str, str], Any] = {
    ("compute", "/flavors/detail"): {
        "flavors": [
            {
                "id": "f-1",
                "name": "spot.small",
                "vcpus": 2,
                "ram": 2048,
                "disk": 10,
                "extra_specs": {
                    "resources:CUSTOM_SPOT_SLOT": "1",
                    "trait:CUSTOM_SPOT_CAPABLE": "required",
                },
            },
            {
                "id": "f-2",
                "name": "std.small",
                "vcpus": 2,
                "ram": 2048,
                "disk": 10,
                "extra_specs": {},
            },
        ]
    },
    ("compute", "/os-aggregates"): {
        "aggregates": [
            {
                "id": 1,
                "name": "hall-a",
                "uuid": "agg-uuid-a",
                "availability_zone": "hall-a",
                "hosts": ["c1"],
            },
            {
                "id": 2,
                "name": "agg-b",
                "uuid": "agg-uuid-b",
                "availability_zone": "hall-b",
                "hosts": ["c2"],
            },
        ]
    },
    ("image", "/images"): {"images": [{"id": "img-1", "name": "cirros", "status": "active"}]},
    ("placement", "/allocation_candidates"): {
        "allocation_requests": [],
        "provider_summaries": {
            "rp-1": {
                "resources": {
                    "VCPU": {"capacity": 16, "used": 2},
                    "MEMORY_MB": {"capacity": 32768, "used": 2048},
                    "DISK_GB": {"capacity": 500, "used": 10},
                    "CUSTOM_SPOT_SLOT": {"capacity": 4, "used": 1},
                },
                "traits": ["CUSTOM_SPOT_CAPABLE"],
            },
            "rp-2": {"resources": {"VCPU": {"capacity": 8, "used": 8}}},
        },
    },
    ("placement", "/resource_providers"): {
        "resource_providers": [{"uuid": "rp-1", "name": "c1", "generation": 3}]
    },
    ("compute", "/limits"): {
        "limits": {
            "absolute": {
                "maxTotalInstances": 20,
                "totalInstancesUsed": 4,
                "maxTotalCores": 40,
                "totalCoresUsed": 8,
                "maxTotalRAMSize": 51200,
                "totalRAMUsed": 8192,
            }
        }
    },
    ("compute", "/servers/detail"): {"servers": SERVERS},
    ("compute", "/servers"): {"reservation_id": "r-abc123"},
    ("compute", "/servers/*/metadata"): {"metadata": SERVERS[0]["metadata"]},
}
WORDS = sorted(
    {"id", "name", "uuid", "status", "metadata", "resources", "capacity", "used", "servers"}
    | {k for doc in ANSWERS.values() for k in (doc if isinstance(doc, dict) else {})}
)
STATUSES = (200,) * 12 + (202, 204, 300, 400, 401, 403, 404, 409, 413, 429, 500, 503)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    text: str


@st.composite
def _answer(draw: st.DrawFn, doc: Any) -> Answer:
    status = draw(st.sampled_from(STATUSES))
    body = draw(mutated(st.just(doc), WORDS, most=3))
    try:
        text = json.dumps(body)
    except (ValueError, RecursionError):
        text = "{}"
    how = draw(st.sampled_from(["json"] * 8 + ["empty", "spoilt", "html"]))
    if how == "empty":
        text = ""
    elif how == "spoilt":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(JUNK)).decode("latin-1") + text[at:]
    elif how == "html":
        text = "<html><body>502 Bad Gateway</body></html>"
    return Answer(status, text)


def clouds() -> st.SearchStrategy[dict[tuple[str, str], Answer]]:
    return st.fixed_dictionaries({key: _answer(doc) for key, doc in ANSWERS.items()})


class _Response:
    def __init__(self, answer: Answer) -> None:
        self.status_code = answer.status
        self.text = answer.text
        self.headers: Mapping[str, str] = {}

    def json(self) -> Any:
        return json.loads(self.text)


class _Session:
    """Answers each request from the case (a path with an id as its `/*` form)."""

    def __init__(self, service: str, cloud: Mapping[tuple[str, str], Answer]) -> None:
        self.service = service
        self.cloud = cloud

    def request(self, url: str, method: str, **kwargs: Any) -> _Response:
        path = url
        parts = url.split("/")
        if len(parts) > 3 and parts[1] == "servers":
            path = "/servers/*/" + "/".join(parts[3:4])
        answer = self.cloud.get((self.service, path))
        if answer is None and method in ("DELETE", "PUT"):
            answer = Answer(204, "")
        return _Response(answer or Answer(404, '{"itemNotFound": {"message": "not found"}}'))


def _provider(cloud: Mapping[tuple[str, str], Answer]) -> OpenStackProvider:
    clock = ManualClock(NOW)
    client = CloudClient(
        lambda service: _Session(service, cloud),
        clock,
        GuardConfig(),
        RetryConfig(attempts=2),
        sleep=lambda _s: None,
    )
    return OpenStackProvider(REGION, client, clock)


def _kept(views: Any, partition: str | None) -> bool:
    return all(
        isinstance(v, ServerView)
        and v.server_id
        and v.pool
        and v.request_id
        and (partition is None or v.partition == partition)
        and math.isfinite(v.created_at)
        and (v.notice_deadline is None or math.isfinite(v.notice_deadline))
        and (v.active_at is None or math.isfinite(v.active_at))
        and type(v.plan_generation) is int
        for v in views
    )


def check_cloud(cloud: Mapping[tuple[str, str], Answer], judge: Judge) -> None:
    provider = _provider(cloud)
    clear = (ProviderError,)

    def discover() -> bool:
        provider.discover()
        return True

    found = judge.call(discover, (ProviderError, RegionError))
    cache = judge.call(provider.refresh, clear)
    if cache is not None:
        rooms = provider.headroom([p.id for p in provider.pools()])
        judge.expect(all(type(n) is int and n >= 0 for n in rooms.values()), "headroom whole, >= 0")
    views = judge.call(lambda: provider.list("p1"), clear)
    if views is not None:
        judge.expect(_kept(views, "p1"), "views of the partition, with finite times")
    every = judge.call(provider.all_servers, clear)
    if every is not None:
        judge.expect(_kept(every, None), "every view with finite times")
    if found is None:
        return  # nothing resolved: a create would be refused for its pool
    actions: list[Callable[[], object]] = [
        lambda: provider.create(POOL, 2, "req-9", "p1", 4),
        lambda: provider.give_notice("s-1", NOW + 120),
        lambda: provider.deliver_token("s-1", Secret("t0ken")),
        lambda: provider.delete(["s-1", "s-2"]),
    ]
    for act in actions:
        judge.call(act, clear)


def cloud_target() -> Target:
    @contextmanager
    def world(_folder: Path) -> Iterator[Check]:
        yield check_cloud

    return Target("nova_placement", clouds(), world, weight=1.0)
