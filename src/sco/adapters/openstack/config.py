"""The OpenStack region file: which flavors in which halls are pools, and how to reach them.

```yaml
region: lab1
image: cirros            # image name or id every server boots
network: none            # "none", "auto", or a network id
headroom_ttl_s: 30
pools:
  - {hall: hall-a, flavor: spot.small, class: spot, price_per_h: 0.1}
  - {hall: hall-a, flavor: std.small, class: guaranteed, price_per_h: 0.3}
credential:              # optional; default: clouds.yaml / OS_* variables
  openbao: {url: https://bao:8200, path: sco/openstack, mount_point: secret}
```

A hall is a Nova host aggregate exposed as an availability zone; a pool's
servers are created in that zone, and its headroom is read from Placement
for the aggregate's members. Tokens for OpenBao come from the environment
(`BAO_TOKEN`, or `BAO_ROLE_ID` and `BAO_SECRET_ID`), never from this file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sco.adapters.files import UnreadableFile, read_text, read_yaml
from sco.adapters.invalid import explain
from sco.domain.pools import CapacityClass, Pool


class RegionFileError(ValueError):
    """The region file is missing or wrong; the message names the field."""


def _name(value: str | None) -> str | None:
    """Region, hall, flavor and aggregate make a pool's id (`region/hall/flavor`)."""
    if value is not None and (not value.strip() or "/" in value):
        raise ValueError(f"must be a name, not empty and without '/': {value!r}")
    return value


class PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    hall: str
    flavor: str
    capacity_class: CapacityClass = Field(alias="class")
    price_per_h: float = Field(ge=0)
    units_per_instance: int = Field(default=1, ge=1)
    aggregate: str | None = None  # Nova host aggregate name; default: the hall
    availability_zone: str | None = None  # default: the hall
    # The reclaim notice the reclaimer promises for this pool's servers (0: none), and
    # create-to-ready time when known (otherwise measured from history).
    notice_s: float = Field(default=0.0, ge=0)
    cold_start_s: float | None = Field(default=None, ge=0)

    _names = field_validator("hall", "flavor", "aggregate")(_name)

    @property
    def aggregate_name(self) -> str:
        return self.aggregate or self.hall

    @property
    def zone(self) -> str:
        return self.availability_zone or self.hall


class OpenBaoSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    path: str
    mount_point: str = "secret"
    lease_s: float = Field(default=3600.0, gt=0)


class CredentialSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    openbao: OpenBaoSpec | None = None


class RegionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    region: str
    image: str
    network: str = "none"
    headroom_ttl_s: float = Field(default=30.0, gt=0)
    headroom_stale_s: float = Field(default=300.0, gt=0)  # older headroom counts as none
    api_timeout_s: float = Field(default=30.0, gt=0)
    rate_per_s: float = Field(default=20.0, gt=0)
    list_page_size: int = Field(default=50, ge=1, le=1000)  # see OpenStackProvider._servers
    pools: list[PoolSpec] = Field(min_length=1)
    credential: CredentialSpec = Field(default_factory=CredentialSpec)
    # Sent with every create (cloud-init): how a server joins its scheduler. Read once.
    user_data_file: Path | None = None
    user_data: str = Field(default="", exclude=True)

    _names = field_validator("region")(_name)

    @field_validator("pools")
    @classmethod
    def _distinct(cls, pools: list[PoolSpec]) -> list[PoolSpec]:
        seen: set[tuple[str, str, str]] = set()
        for p in pools:
            key = (p.hall, p.flavor, p.aggregate_name)
            if key in seen:
                raise ValueError(f"pool {p.hall}/{p.flavor} is listed twice")
            seen.add(key)
        return pools

    def domain_pools(self) -> list[Pool]:
        return [self.domain_pool(p) for p in self.pools]

    def domain_pool(self, p: PoolSpec) -> Pool:
        return Pool(
            self.region,
            p.hall,
            p.flavor,
            p.capacity_class,
            p.units_per_instance,
            p.price_per_h,
            aggregate=p.aggregate if p.aggregate and p.aggregate != p.hall else None,
            notice_s=p.notice_s,
            cold_start_s=p.cold_start_s,
        )

    def spec_by_pool(self) -> Mapping[str, PoolSpec]:
        return {self.domain_pool(p).id: p for p in self.pools}


def load_region(path: Path | str) -> RegionSpec:
    try:
        raw = read_yaml(Path(path))
    except UnreadableFile as e:
        raise RegionFileError(f"{path}: {e.reason}") from None
    try:
        spec = RegionSpec.model_validate(raw)
    except ValidationError as e:
        where, msg = explain(e, RegionSpec)
        raise RegionFileError(f"{path}: {where}: {msg}") from None
    if spec.user_data_file is None:
        return spec
    data = spec.user_data_file
    data = data if data.is_absolute() else Path(path).parent / data
    try:
        text = read_text(data)
    except UnreadableFile as e:
        raise RegionFileError(f"{path}: user_data_file: {data}: {e.reason}") from None
    if len(text.encode()) > 65535:
        raise RegionFileError(f"{path}: user_data_file: {data} is over Nova's 64 KiB")
    return spec.model_copy(update={"user_data": text})
