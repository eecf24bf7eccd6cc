"""Table definitions used by queries. The schema itself is created by the migrations."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
    true,
)

metadata = MetaData()

pools = Table(
    "pools",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("region", String(64), nullable=False),
    Column("hall", String(64), nullable=False),
    Column("flavor", String(128), nullable=False),
    Column("aggregate", String(128)),
    Column("capacity_class", String(16), nullable=False),
    Column("units_per_instance", Integer, nullable=False),
    Column("price_per_h", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("up_since", Float),
    Column("notice_s", Float, nullable=False, server_default="0"),
    Column("cold_start_s", Float),
)

instances = Table(
    "instances",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("partition", String(128), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("capacity_class", String(16), nullable=False),
    Column("units", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("request_id", String(64), nullable=False),
    Column("plan_generation", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("state_since", Float, nullable=False),
    Column("server_id", String(64)),
    Column("ready_at", Float),
    Column("drain_by", Float),
    Column("notice_deadline", Float),
    Column("reason", Text, nullable=False),
    Column("fence", BigInteger, nullable=False, server_default="0"),
    Index("ix_instances_partition_state", "partition", "state"),
    Index("ix_instances_request", "request_id"),
)

instance_history = Table(
    "instance_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("instance_id", String(64), nullable=False),
    Column("partition", String(128), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("at", Float, nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("trigger", String(32)),
    Column("reason", Text, nullable=False),
    Column("code", String(32)),
    Index("ix_history_instance", "instance_id"),
    Index("ix_history_at", "at"),
)

reservations = Table(
    "reservations",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("pool", String(255), nullable=False),
    Column("partition", String(128), nullable=False),
    Column("count", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("fence", BigInteger, nullable=False, server_default="0"),
    Index("ix_reservations_pool", "pool"),
)

plans = Table(
    "plans",
    metadata,
    Column("partition", String(128), primary_key=True),
    Column("generation", Integer, primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("spot", Text, nullable=False),
    Column("guaranteed", Text, nullable=False),
    Column("notes", Text, nullable=False),
    Column("fence", BigInteger, nullable=False, server_default="0"),
    Column("pools", Text, nullable=False, server_default="{}"),
    Column("terms", Text, nullable=False, server_default="{}"),
)

leases = Table(
    "leases",
    metadata,
    Column("partition", String(128), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("acquired_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

replicas = Table(
    "replicas",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("expires_at", Float, nullable=False),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(128), nullable=False, unique=True),
    Column("pool", String(255), nullable=False),
    Column("payload", Text, nullable=False),
)

event_log = Table(
    "event_log",
    metadata,
    Column("offset", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(128), nullable=False, unique=True),
    Column("pool", String(255), nullable=False),
    Column("payload", Text, nullable=False),
)

consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("consumer", String(128), primary_key=True),
    Column("offset", Integer, nullable=False),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("consumer", String(128), nullable=False),
    Column("offset", Integer, nullable=False),
    Column("payload", Text, nullable=False),
    Column("error", Text, nullable=False),
)

exclusions = Table(
    "exclusions",
    metadata,
    Column("pool", String(255), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("since", Float, nullable=False),
    Column("until", Float, nullable=False),
    Column("cooldown_s", Float, nullable=False),
    Column("last_crossing", Float, nullable=False),
    Column("reason", Text, nullable=False),
    Column("version", Integer, nullable=False),
)

pool_scores = Table(
    "pool_scores",
    metadata,
    Column("generation", Integer, primary_key=True),
    Column("pool", String(255), primary_key=True),
    Column("computed_at", Float, nullable=False),
    Column("body", Text, nullable=False),
)

partition_intents = Table(
    "partition_intents",
    metadata,
    Column("partition", String(128), primary_key=True),
    Column("intent", String(16), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("requested_by", String(255), nullable=False),
)

contracts = Table(
    "contracts",
    metadata,
    Column("instance_id", String(64), primary_key=True),
    Column("partition", String(128), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("capacity_class", String(16), nullable=False),
    Column("plan_generation", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("server_id", String(64)),
    Column("drain_by", Float),
    Column("reclaim", Boolean, nullable=False, server_default=false()),
    Column("version", Integer, nullable=False),
    Column("changed_at", Float, nullable=False),
    Column("token_hash", String(64)),
    Column("token_expires_at", Float),
    Column("prev_token_hash", String(64)),  # the token the last one replaced
    Column("prev_token_expires_at", Float),
    Column("token_set_at", Float),
    Column("token_delivered", Boolean, nullable=False, server_default=true()),
    Column("delivered_token_hash", String(64)),  # the token last seen to reach the node
    Column("delivered_token_expires_at", Float),
    Column("ack_version", Integer),
    Column("ack_status", String(16)),
    Column("ack_detail", Text),
    Column("ack_at", Float),
)

contract_changes = Table(
    "contract_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("instance_id", String(64), nullable=False),
    Column("at", Float, nullable=False),
)
