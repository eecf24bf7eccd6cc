"""`sco.yaml`: one configuration file for every `sco` process.

Read once at a command's entry and handed down as values; adapters never read
the environment. Every field can be overridden by an environment variable,
`SCO_` and the field's path in capitals with `__` between levels
(`SCO_STATE__URL`, `SCO_POLICY__HEDGE__MAX_SPARE`, `SCO_EVENTS__KAFKA__SASL_PASSWORD`),
and a command's own flags override both. Relative paths in the file are read
from the file's folder. `sco config check FILE` validates a file and prints
what it resolves to, secrets masked; every error names the field.

```yaml
state: {url: sqlite:///sco-state.sqlite}      # or postgresql+psycopg://...
events: {kind: embedded}                      # or kind: kafka, kafka: {brokers: ...}
history: {url: chdb://sco-history}            # or http://clickhouse:8123
leases: {kind: database, ttl_s: 15}           # or kind: kubernetes, kubernetes: {...}
provider: {kind: openstack, cloud: mycloud, region_file: region.yaml}
partitions:                                   # as in a demand file; or demand_file: PATH
  - {name: batch, kind: slurm, target_units: 8, floor_units: 2, max_units: 16}
policy: {name: sco, interval_s: 15, hedge: {max_spare: 2}}
http: {bind: 0.0.0.0, run_port: 9100}
log: {level: info, format: text}
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from sco.adapters.demandfile.intake import (
    DemandFileError,
    PartitionSpec,
    Value,
    demand_of,
)
from sco.adapters.files import UnreadableFile, read_yaml
from sco.adapters.invalid import explain, first
from sco.assembly.sections import (
    DistributorSettings,
    EventsSettings,
    HistorySettings,
    HttpSettings,
    KubernetesClusterSettings,
    KubernetesPartitionSettings,
    LeaseSettings,
    LogSettings,
    PolicySettings,
    ProviderSettings,
    SlurmClusterSettings,
    SlurmPartitionSettings,
    StateSettings,
)

ENV_PREFIX = "SCO_"
ENV_DELIMITER = "__"


class SettingsError(ValueError):
    """A configuration that cannot be used; the message names the source and field."""


class PartitionSettings(PartitionSpec):
    """A partition as `sco.yaml` gives it: a demand-file entry, and where its demand comes
    from (`static`: the numbers here; `slurm`: the pending jobs of Slurm partitions;
    `kubernetes`: the unschedulable pods of a Kubernetes cluster)."""

    target_units: Value = Field(
        default=0,
        description="Units wanted (demand static): a number, {daily: {HH:MM: n}} (UTC) or "
        "{steps: [[offset_s, n], ...]}.",
    )
    demand: Literal["static", "slurm", "kubernetes"] = Field(
        default="static",
        description="Where the demand comes from: target_units, a Slurm queue or "
        "a Kubernetes cluster's unschedulable pods.",
    )
    slurm: SlurmPartitionSettings | None = Field(default=None, description="For demand slurm.")
    kubernetes: KubernetesPartitionSettings | None = Field(
        default=None, description="For demand kubernetes."
    )
    agents: bool = Field(
        default=False,
        description="Its nodes run `sco agent`: sco hands each server a node token, and a "
        "node counts as drained when its agent says so (or at drain_by).",
    )

    @model_validator(mode="after")
    def _scheduler_section(self) -> PartitionSettings:
        needs = {"slurm": "partitions, cpus, memory_mb", "kubernetes": "allocatable"}
        for kind, what in needs.items():
            if self.demand == kind and getattr(self, kind) is None:
                raise ValueError(f"demand {kind} needs a {kind} section ({what})")
            if getattr(self, kind) is not None and self.demand != kind:
                raise ValueError(f"a {kind} section needs demand: {kind}")
        if self.demand in needs:
            for name in ("target_units", "floor_units"):
                if not isinstance(getattr(self, name), int):
                    raise ValueError(
                        f"{name}: a number for demand {self.demand} (the scheduler gives the rest)"
                    )
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    installation: str = Field(
        default="default",
        min_length=1,
        max_length=40,
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="This sco's name among the installations that share a cloud project or "
        "a scheduler cluster (lowercase letters, digits and '-'): every server sco creates is "
        "tagged with it, and sco lists, adopts and deletes only servers with its own. Two "
        "installations in one project must have different names; servers tagged by sco "
        "before installations had names belong to `default`.",
    )
    state: StateSettings = Field(default_factory=StateSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    leases: LeaseSettings = Field(default_factory=LeaseSettings)
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    partitions: list[PartitionSettings] = Field(
        default_factory=list, description="Scheduler clusters and their demand."
    )
    slurm: dict[str, SlurmClusterSettings] = Field(
        default_factory=dict, description="Slurm clusters by name, for `demand: slurm`."
    )
    kubernetes: dict[str, KubernetesClusterSettings] = Field(
        default_factory=dict,
        description="Kubernetes clusters by name, for `demand: kubernetes`.",
    )
    demand_file: Path | None = Field(
        default=None, description="Partitions from a demand file instead of `partitions`."
    )
    policy: PolicySettings = Field(default_factory=PolicySettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    distributor: DistributorSettings = Field(default_factory=DistributorSettings)
    log: LogSettings = Field(default_factory=LogSettings)

    @model_validator(mode="after")
    def _one_demand(self) -> Settings:
        if self.partitions and self.demand_file is not None:
            raise ValueError("give partitions or demand_file, not both")
        try:
            demand_of(self.partitions, "", "partitions")
        except DemandFileError as e:
            raise ValueError(
                f"partitions{e.field.removeprefix('partitions')}: {e.reason}"
            ) from None
        for p in self.partitions:
            section = p.slurm or p.kubernetes
            clusters: Mapping[str, object] = self.slurm if p.slurm else self.kubernetes
            if section is None or section.cluster in clusters or section.cluster == "default":
                continue
            raise ValueError(
                f"partitions.{p.name}.{p.demand}.cluster: {section.cluster!r} is not in "
                f"the {p.demand} section ({', '.join(sorted(clusters)) or 'empty'})"
            )
        return self

    def slurm_cluster(self, name: str) -> SlurmClusterSettings:
        """A cluster of the `slurm` section; `default` may be left out (tools on PATH)."""
        return self.slurm.get(name) or SlurmClusterSettings()

    def kubernetes_cluster(self, name: str) -> KubernetesClusterSettings:
        """A cluster of the `kubernetes` section; `default` may be left out (KUBECONFIG
        or ~/.kube/config)."""
        return self.kubernetes.get(name) or KubernetesClusterSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003 (not read: no .env)
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) over the environment over the file.
        return (init_settings, env_settings, _FileSource(settings_cls, _FILE.get() or {}))


class _FileSource(PydanticBaseSettingsSource):
    """The YAML file, read (and its relative paths resolved) before settings are built."""

    def __init__(self, settings_cls: type[BaseSettings], doc: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.doc = doc

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002
        return self.doc.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.doc)


_FILE: ContextVar[dict[str, Any] | None] = ContextVar("sco_settings_file", default=None)


def load(path: Path | None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """The file at `path` (None: defaults only), under the environment, under
    `overrides` (dotted field paths from flags, e.g. {"state.url": ...}; None values
    are not given).

    Raises SettingsError naming the file or variable and the field.
    """
    doc: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        doc = _read(path)
        _resolve_paths(doc, path.parent)
    flags: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _put(flags, dotted.split("."), value)
    token = _FILE.set(doc)
    try:
        return Settings(**flags)
    except ValidationError as e:
        raise SettingsError(_explain(e, where)) from None
    finally:
        _FILE.reset(token)


def _put(doc: dict[str, Any], path: list[str], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        nxt = node.get(key)
        if not isinstance(nxt, dict):
            nxt = node[key] = {}
        node = nxt
    node[path[-1]] = value


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = read_yaml(path)
    except UnreadableFile as e:
        raise SettingsError(f"{path}: {e.reason}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: must be a mapping of sections (state, events, ...)")
    for key in raw:
        if not isinstance(key, str):
            # YAML 1.1 reads some bare keys as numbers or dates (00:00 is 0, 1_0 is 10).
            raise SettingsError(f"{path}: section {key} is not a name (quote it if it is one)")
    return raw


_PATHS = (
    ("provider", "region_file"),
    ("provider", "clouds_file"),
    ("demand_file",),
    ("leases", "kubernetes", "kubeconfig"),
    ("distributor", "tls_cert"),
    ("distributor", "tls_key"),
)


def _resolve_paths(doc: dict[str, Any], base: Path) -> None:
    """Relative paths (and chdb:// and sqlite:/// URLs) in a file are the file's folder's,
    made absolute: a `chdb://` URL's first part would otherwise be read as a host."""
    base = base.resolve()
    clusters = doc.get("slurm")
    paths = list(_PATHS)
    if isinstance(clusters, dict):
        paths += [("slurm", name, key) for name in clusters for key in ("conf", "bin_dir")]
    kube = doc.get("kubernetes")
    if isinstance(kube, dict):
        paths += [("kubernetes", name, "kubeconfig") for name in kube]
    for path in paths:
        node: Any = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(path[-1]), str):
            p = Path(node[path[-1]]).expanduser()
            node[path[-1]] = str(p if p.is_absolute() else base / p)
    for section, prefix in (
        ("state", "sqlite:///"),
        ("history", "chdb://"),
        ("events", "sqlite:///"),
    ):
        node = doc.get(section)
        url = node.get("url") if isinstance(node, dict) else None
        if isinstance(url, str) and url.startswith(prefix) and not url.startswith(prefix + "/"):
            rest = url[len(prefix) :]
            if rest and not rest.startswith(":memory:"):
                node["url"] = prefix + str(base / rest)


def _explain(e: ValidationError, where: str) -> str:
    err = first(e)
    field, msg = explain(e, Settings)
    var = ENV_PREFIX + ENV_DELIMITER.join(str(x).upper() for x in err["loc"] if isinstance(x, str))
    source = f"{var} (environment)" if var in os.environ else where
    if field == "file":  # a check of the whole file: its message names the field
        return f"{source}: {msg}"
    return f"{source}: {field}: {msg}"


def chdb_path(url: str) -> str | None:
    """The folder of an embedded history URL, or None for a server."""
    return url[len("chdb://") :] if url.startswith("chdb://") else None


def masked(settings: Settings) -> dict[str, Any]:
    """The resolved configuration as plain data, secrets shown as stars."""
    doc: dict[str, Any] = settings.model_dump(mode="json")
    url = doc["state"]["url"]
    doc["state"]["url"] = mask_url(url)
    if doc["events"].get("url"):
        doc["events"]["url"] = mask_url(doc["events"]["url"])
    doc["history"]["url"] = mask_url(doc["history"]["url"])
    kafka = doc["events"].get("kafka")
    if kafka and kafka.get("client"):
        kafka["client"] = {
            k: "**********" if secret_property(k) else v for k, v in kafka["client"].items()
        }
    return doc


# librdkafka properties that hold a secret (passwords, client secrets, PEM keys, and
# the OAUTHBEARER config string, which may carry a principal's secret).
_SECRET_WORDS = ("password", "secret", "pem", "sasl.oauthbearer.config", "sasl.jaas")


def secret_property(name: str) -> bool:
    """Whether a librdkafka property in `events.kafka.client` holds a secret."""
    return any(word in name.lower() for word in _SECRET_WORDS)


def mask_url(url: str) -> str:
    """A password in a URL (`scheme://user:secret@host`) shown as stars."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    auth, _, host = rest.partition("@")
    user = auth.split(":", 1)[0]
    return f"{head}://{user}:***@{host}" if ":" in auth else url
