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
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
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
    field_path,
)
from sco.adapters.files import UnreadableFile, read_yaml
from sco.decide.exclusion import ExclusionConfig
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import runnable_policy
from sco.decide.scorer import ScorerConfig
from sco.engine.controller import ControllerConfig

ENV_PREFIX = "SCO_"
ENV_DELIMITER = "__"


class SettingsError(ValueError):
    """A configuration that cannot be used; the message names the source and field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StateSettings(_Section):
    url: str = Field(
        default="sqlite:///sco-state.sqlite",
        description="Fleet state: sqlite:///PATH (one host) or postgresql+psycopg://... "
        "(list every Patroni member with target_session_attrs=read-write).",
    )
    start_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="How long a long-running command (run, watch, score, history load, "
        "distributor, status) keeps trying to reach the database at start, as through a "
        "failover, before it exits 2; one-shot commands try once.",
    )


class KafkaSettings(_Section):
    brokers: str = Field(description="Bootstrap brokers, host:port[,host:port...].")
    topic_prefix: str = Field(default="sco.events.", description="Topics are <prefix><region>.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How clients reach the brokers."
    )
    sasl_mechanism: str | None = Field(default=None, description="PLAIN, SCRAM-SHA-512, ...")
    sasl_username: str | None = Field(default=None, description="SASL user.")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    ssl_ca_location: str | None = Field(default=None, description="CA bundle (PEM file).")
    ssl_certificate_location: str | None = Field(
        default=None, description="Client certificate (PEM file), for mutual TLS."
    )
    ssl_key_location: str | None = Field(default=None, description="Its key (PEM file).")
    ssl_key_password: SecretStr | None = Field(default=None, description="The key's password.")
    regions: list[str] | None = Field(
        default=None,
        description="Regions whose topics the consumers read (default: the provider's region, "
        "else the regions of the pools in fleet state, else every topic with the prefix).",
    )
    new_topic_partitions: int | None = Field(
        default=3,
        ge=1,
        description="Create missing topics with this many partitions; null: they must exist.",
    )
    client: dict[str, str] = Field(
        default_factory=dict, description="Further librdkafka properties for every client."
    )

    def librdkafka(self) -> dict[str, str]:
        """The client properties, secrets revealed: only for the Kafka client itself."""
        props: dict[str, str] = {"security.protocol": self.security_protocol}
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
        }
        props.update({k: v for k, v in optional.items() if v})
        for key, secret in (
            ("sasl.password", self.sasl_password),
            ("ssl.key.password", self.ssl_key_password),
        ):
            if secret is not None:
                props[key] = secret.get_secret_value()
        return {**props, **self.client}


class EventsSettings(_Section):
    kind: Literal["embedded", "kafka"] = Field(
        default="embedded",
        description="embedded: a log table in a database; kafka: a topic per region.",
    )
    url: str | None = Field(
        default=None,
        description="embedded only: a database of its own for the log (default: the state's).",
    )
    kafka: KafkaSettings | None = None

    @model_validator(mode="after")
    def _kafka_needs_brokers(self) -> EventsSettings:
        if self.kind == "kafka" and self.kafka is None:
            raise ValueError("kind kafka needs a kafka section with brokers")
        return self


class HistorySettings(_Section):
    url: str = Field(
        default="chdb://sco-history",
        description="Pool history: chdb://PATH (embedded ClickHouse) or http(s)://host:8123.",
    )
    database: str = Field(
        default="sco", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="ClickHouse database."
    )
    username: str | None = Field(default=None, description="ClickHouse user (a server only).")
    password: SecretStr | None = Field(default=None, description="Its password.")


class KubernetesLeaseSettings(_Section):
    namespace: str = Field(default="sco", description="Namespace of the Lease objects.")
    kubeconfig: str | None = Field(
        default=None, description="A kubeconfig file; null: the in-cluster service account."
    )
    context: str | None = None


class LeaseSettings(_Section):
    kind: Literal["database", "kubernetes"] = Field(
        default="database", description="Where partition leases live."
    )
    ttl_s: float = Field(
        default=15.0, ge=3.0, description="A dead replica's partitions move after this long."
    )
    kubernetes: KubernetesLeaseSettings = Field(default_factory=KubernetesLeaseSettings)


class ProviderSettings(_Section):
    kind: Literal["openstack"] = Field(default="openstack", description="The cloud's API.")
    cloud: str | None = Field(default=None, description="Cloud name in clouds.yaml.")
    region_file: Path | None = Field(
        default=None, description="Region file: pools (hall, flavor, class, price), image."
    )
    clouds_file: Path | None = Field(
        default=None,
        description="A clouds.yaml of its own (default: OS_CLIENT_CONFIG_FILE or the usual "
        "places).",
    )
    projects: list[str] = Field(
        default_factory=list,
        description="Ids of the OpenStack projects whose servers are sco's (default: the "
        "project the credential is scoped to). A server of any other project is foreign: "
        "reported and left alone, whatever its tags. Projects other than the credential's "
        "are listed across tenants, which only an admin credential may (`sco reclaim` run "
        "by the cloud operator).",
    )
    roles: list[str] = Field(
        default_factory=lambda: ["member", "reader"],
        description="The roles sco's credential is meant to hold (add the cloud's role that "
        "may read host aggregates and Placement); any other role, or a system or domain "
        "scope, is warned of at start and counted in sco_credential_excess.",
    )

    @field_validator("projects")
    @classmethod
    def _project_ids(cls, v: list[str]) -> list[str]:
        if any(not p.strip() for p in v):
            raise ValueError("a project id may not be empty")
        return v


class PolicySettings(_Section):
    name: str = Field(
        default="sco",
        description="Placement policy by name (`sco policies`); one that keeps the floor.",
    )
    interval_s: float = Field(default=15.0, gt=0, description="Time between a partition's cycles.")
    hedge: HedgeConfig = Field(default_factory=HedgeConfig, description="The sco policy.")
    controller: ControllerConfig = Field(
        default_factory=ControllerConfig,
        description="Acting (batch size, drain time, per-state timeouts) and reservations.",
    )
    exclusion: ExclusionConfig = Field(default_factory=ExclusionConfig)
    scorer: ScorerConfig = Field(default_factory=ScorerConfig)
    score_every_s: float = Field(default=300.0, gt=0, description="`sco score --every` default.")

    @field_validator("name")
    @classmethod
    def _runnable(cls, v: str) -> str:
        # Only `sco run` reads it (simulation and evaluation take --policy): a baseline
        # without a floor would run real partitions with nothing under them.
        return runnable_policy(v)


class HttpSettings(_Section):
    bind: str = Field(default="0.0.0.0", description="Address the /metrics and /healthz listen on.")
    run_port: int = Field(default=9100, ge=0, le=65535, description="`sco run`; 0: none.")
    watch_port: int = Field(default=9101, ge=0, le=65535, description="`sco watch`; 0: none.")
    score_port: int = Field(default=9102, ge=0, le=65535, description="`sco score`; 0: none.")
    history_port: int = Field(
        default=9103, ge=0, le=65535, description="`sco history load`; 0: none."
    )
    status_port: int = Field(default=9104, ge=1, le=65535, description="`sco status`'s page.")


class DistributorSettings(_Section):
    bind: str = Field(default="0.0.0.0", description="Address `sco distributor` listens on.")
    port: int = Field(default=8443, ge=0, le=65535, description="Its port (API and /metrics).")
    tls_cert: Path | None = Field(default=None, description="PEM certificate: serve HTTPS.")
    tls_key: Path | None = Field(default=None, description="PEM key of `tls_cert`.")
    max_wait_s: float = Field(
        default=60.0, gt=0, le=300, description="The longest long poll (`?wait=`) granted."
    )
    poll_s: float = Field(
        default=0.25,
        gt=0,
        description="How often a replica looks for changed contracts without NOTIFY (SQLite).",
    )
    lease_s: float = Field(
        default=300.0,
        gt=0,
        description="A contract's lease: how long an agent trusts it without hearing again.",
    )
    token_ttl_s: float = Field(
        default=30 * 86400.0, gt=0, description="How long a node token is valid once issued."
    )
    auth_failures_per_min: float = Field(
        default=30.0, gt=0, description="Failed authentications allowed per client address."
    )
    requests_per_s: float = Field(
        default=5.0, gt=0, description="Requests allowed per node token (burst: 4 times that)."
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> DistributorSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        return self


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe records written."
    )
    format: Literal["text", "json"] = Field(
        default="text", description="text: one line per record; json: one JSON object per line."
    )


class SlurmClusterSettings(_Section):
    conf: Path | None = Field(
        default=None, description="The cluster's slurm.conf (SLURM_CONF for its tools)."
    )
    bin_dir: Path | None = Field(
        default=None, description="Where squeue, sinfo and scontrol are (default: PATH)."
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Each tool call's time limit.")
    cache_s: float = Field(
        default=2.0, ge=0, description="One read of jobs and nodes serves its partitions this long."
    )


class SlurmPartitionSettings(_Section):
    cluster: str = Field(default="default", description="A cluster of the `slurm` section.")
    partitions: list[str] = Field(
        min_length=1, description="Slurm partitions whose pending jobs are the demand."
    )
    cpus: float = Field(gt=0, description="CPUs of one node (the flavor's).")
    memory_mb: float = Field(gt=0, description="Memory of one node, MB (as slurmd reports it).")
    gres: dict[str, int] = Field(default_factory=dict, description="GRES of one node: {gpu: 1}.")
    requeue_lead_s: float = Field(
        default=30.0, ge=0, description="A reclaim's jobs are requeued this long before it."
    )
    idle_keep_s: float = Field(
        default=300.0, ge=0, description="An idle node is still wanted this long after its job."
    )


class KubernetesClusterSettings(_Section):
    kubeconfig: Path | None = Field(
        default=None,
        description="A kubeconfig file; null: the in-cluster service account, else "
        "KUBECONFIG or ~/.kube/config.",
    )
    context: str | None = Field(default=None, description="A context of the kubeconfig.")
    in_cluster: bool = Field(
        default=False, description="Use the pod's service account (sco runs in the cluster)."
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Each API call's time limit.")
    watch_timeout_s: int = Field(
        default=300, ge=1, description="A watch is renewed after this long (server side)."
    )
    grace_s: float = Field(
        default=30.0,
        ge=0,
        description="Pods still on a leaving node are deleted this long before its deadline.",
    )

    @model_validator(mode="after")
    def _one_way_in(self) -> KubernetesClusterSettings:
        if self.in_cluster and self.kubeconfig is not None:
            raise ValueError("give kubeconfig or in_cluster, not both")
        return self


class KubernetesPartitionSettings(_Section):
    cluster: str = Field(default="default", description="A cluster of the `kubernetes` section.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels that make a node the partition's, put on its nodes "
        "(default: sco.io/partition=<name>).",
    )
    allocatable: dict[str, str] = Field(
        description="A node's allocatable, as its kubelet reports it: {cpu: '4', memory: "
        "15Gi, pods: '110', nvidia.com/gpu: '1'}.",
    )
    daemonset_overhead: dict[str, str] = Field(
        default_factory=dict, description="What the DaemonSets request on every node."
    )
    spot_taint: bool = Field(
        default=False,
        description="Spot nodes carry sco.io/capacity-class=spot:NoSchedule; pods that do "
        "not tolerate it need guaranteed nodes.",
    )

    @field_validator("allocatable")
    @classmethod
    def _cpu_and_memory(cls, v: dict[str, str]) -> dict[str, str]:
        missing = [k for k in ("cpu", "memory") if k not in v]
        if missing:
            raise ValueError(f"needs {' and '.join(missing)}")
        return v


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
    """Relative paths (and chdb:// and sqlite:/// URLs) in a file are the file's folder's."""
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
    err = e.errors()[0]
    field = field_path(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
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
