"""The sections of `sco.yaml`, one model per component: each field with its default,
a description and a unit, refused with a message that names it. `sco.assembly.settings`
puts them together and reads the file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from sco.decide.exclusion import ExclusionConfig
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import runnable_policy
from sco.decide.scorer import ScorerConfig
from sco.engine.cycle import ControllerConfig


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
        "distributor, status) keeps trying to reach the database at start (and the event "
        "log's own, events.url), as through a failover, before it exits 2; one-shot "
        "commands try once.",
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

    calls_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Creates and deletes a `sco run` replica has with the cloud at once. "
        "They are sent off the partitions' cycles, which wait only for their listings; "
        "more at once only crowd the API that answers those listings.",
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
    score_every_s: float = Field(
        default=300.0,
        gt=0,
        description="How often `sco score --every` and `sco history load --score-every` score "
        "when the option is given without a duration (without the option, `sco score` makes "
        "one pass and the loader does not score).",
    )

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
    score_port: int = Field(
        default=9102,
        ge=0,
        le=65535,
        description="`sco score --every`; 0: none. One pass (no --every) serves no port.",
    )
    history_port: int = Field(
        default=9103, ge=0, le=65535, description="`sco history load`; 0: none."
    )
    status_port: int = Field(default=9104, ge=1, le=65535, description="`sco status`'s page.")
    status_bind: str = Field(
        default="127.0.0.1",
        description="Address `sco status`'s page listens on: loopback unless told (it shows "
        "the whole fleet and asks no password; the Helm chart listens on the pod's address "
        "behind a ClusterIP Service).",
    )


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
    one_pool: bool = Field(
        default=False,
        description="Slurm keeps each job of many nodes in one pool (the job_submit.lua "
        "of `sco slurm job-submit`): a job no pool's idle nodes hold asks for new nodes "
        "in one pool instead of counting on idle nodes spread over pools.",
    )
    one_pool_max_nodes: int | None = Field(
        default=None,
        ge=2,
        description="With one_pool, jobs of more nodes than this (more than any pool "
        "holds) are left free to span pools: kept in one, they would wait forever.",
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

    @field_validator("labels")
    @classmethod
    def _not_the_installation(cls, v: dict[str, str]) -> dict[str, str]:
        if "sco.io/installation" in v:
            raise ValueError("sco.io/installation is set from `installation`, not here")
        return v

    @field_validator("allocatable")
    @classmethod
    def _cpu_and_memory(cls, v: dict[str, str]) -> dict[str, str]:
        missing = [k for k in ("cpu", "memory") if k not in v]
        if missing:
            raise ValueError(f"needs {' and '.join(missing)}")
        return v
