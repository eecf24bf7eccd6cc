"""Initial fleet state: pools, instances with history, reservations, plans.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("hall", sa.String(64), nullable=False),
        sa.Column("flavor", sa.String(128), nullable=False),
        sa.Column("aggregate", sa.String(128)),
        sa.Column("capacity_class", sa.String(16), nullable=False),
        sa.Column("units_per_instance", sa.Integer, nullable=False),
        sa.Column("price_per_h", sa.Float, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "instances",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("partition", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("capacity_class", sa.String(16), nullable=False),
        sa.Column("units", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("plan_generation", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("state_since", sa.Float, nullable=False),
        sa.Column("server_id", sa.String(64)),
        sa.Column("ready_at", sa.Float),
        sa.Column("drain_by", sa.Float),
        sa.Column("notice_deadline", sa.Float),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_instances_partition_state", "instances", ["partition", "state"])
    op.create_index("ix_instances_request", "instances", ["request_id"])
    op.create_table(
        "instance_history",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("partition", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("trigger", sa.String(32)),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_history_instance", "instance_history", ["instance_id"])
    op.create_table(
        "reservations",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("partition", sa.String(128), nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_reservations_pool", "reservations", ["pool"])
    op.create_table(
        "plans",
        sa.Column("partition", sa.String(128), primary_key=True),
        sa.Column("generation", sa.Integer, primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("spot", sa.Text, nullable=False),
        sa.Column("guaranteed", sa.Text, nullable=False),
        sa.Column("notes", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plans")
    op.drop_table("reservations")
    op.drop_table("instance_history")
    op.drop_table("instances")
    op.drop_table("pools")
