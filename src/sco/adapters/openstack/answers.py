"""The shapes of the Nova, Placement and Glance answers sco reads, checked where
they enter sco.

An answer that is not of its shape (a proxy's page, a field of another type, a
list where an object is due) raises `MalformedAnswer`, a retryable provider
error naming the request and the field: the controller's next step is the one
for a cloud that failed this time, never a traceback from deep in a parser.
Only what sco reads is described; other fields pass unread.

Server records are the exception, checked one at a time by
`sco.adapters.openstack.resources.server_views`: one unreadable server is
reported and skipped, and never hides the rest of a listing.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from sco.ports import RetryableProviderError


class MalformedAnswer(RetryableProviderError):
    """The cloud answered something that is not of the answer's shape."""


def _text(value: object) -> object:
    """Ids and names as Nova sends them: strings, and integer ids as their digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_text)]
Count = Annotated[int, Field(strict=True)]  # JSON integers only: not true, "4" or 4.5


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Flavor(_Answer):
    id: Text
    name: Text
    vcpus: Count = Field(ge=0)
    ram: Count = Field(ge=0)
    disk: Count | None = Field(default=None, ge=0)
    extra_specs: dict[str, Text] | None = None


class Aggregate(_Answer):
    name: Text
    uuid: Text
    availability_zone: Text | None = None


class Aggregates(_Answer):
    aggregates: list[Aggregate] = []


class Image(_Answer):
    id: Text


class Images(_Answer):
    images: list[Image] = []


class Usage(_Answer):
    capacity: Count = 0
    used: Count = 0


class ProviderSummary(_Answer):
    resources: dict[str, Usage] = {}


class AllocationCandidates(_Answer):
    provider_summaries: dict[str, ProviderSummary] = {}


class ResourceProvider(_Answer):
    uuid: Text


class ResourceProviders(_Answer):
    resource_providers: list[ResourceProvider] = []


class Absolute(_Answer):
    """`GET /limits`: -1 (or absent) is unlimited."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    max_instances: Count = Field(default=-1, alias="maxTotalInstances")
    instances_used: Count = Field(default=0, alias="totalInstancesUsed")
    max_cores: Count = Field(default=-1, alias="maxTotalCores")
    cores_used: Count = Field(default=0, alias="totalCoresUsed")
    max_ram_mb: Count = Field(default=-1, alias="maxTotalRAMSize")
    ram_used_mb: Count = Field(default=0, alias="totalRAMUsed")


class Limits(_Answer):
    absolute: Absolute = Absolute()


class LimitsAnswer(_Answer):
    limits: Limits = Limits()


class Created(_Answer):
    """A multi-create with `return_reservation_id`."""

    reservation_id: Text = Field(min_length=1)


class Metadata(_Answer):
    metadata: dict[str, Text] = {}


class ServerOwner(_Answer):
    tenant_id: Text | None = None


class ServerAnswer(_Answer):
    server: ServerOwner


M = TypeVar("M", bound=BaseModel)


def read(model: type[M], answer: Any, what: str) -> M:
    """`answer` (None: no body) as `model`; raises MalformedAnswer naming `what` (the
    request, e.g. "compute GET /limits") and the first field that is wrong."""
    try:
        return model.model_validate({} if answer is None else answer)
    except ValidationError as e:
        raise MalformedAnswer(f"{what}: unexpected answer: {_first(e)}") from None


def page(answer: Any, key: str, what: str) -> list[dict[str, Any]]:
    """The records under `key` of one page of a list (none when absent), as objects,
    each to be read on its own."""
    if answer is None:
        return []
    if not isinstance(answer, dict):
        raise MalformedAnswer(f"{what}: unexpected answer: not a JSON object")
    items = answer.get(key) or []
    if not isinstance(items, list) or not all(isinstance(r, dict) for r in items):
        raise MalformedAnswer(f"{what}: unexpected answer: {key} is not a list of objects")
    return items


def _first(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "the answer"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"
