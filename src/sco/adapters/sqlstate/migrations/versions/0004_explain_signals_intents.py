"""Plans that explain themselves, reason codes on transitions, pool ages shared by
replicas, and partition intents (hand a partition back).

- plans.pools, plans.terms: per pool what the planner weighed, and the
  partition's own figures (JSON);
- instance_history.code: the reason code of each transition, and an index on
  its time, for the recent reclaims every controller reads;
- pools.up_since: since when the pool has had capacity (its age, which the
  hazard falls with), kept in fleet state so every replica plans with it;
- partition_intents: what an operator asked of a partition (`handback`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: a batch (copy and move) on SQLite would drop the fencing triggers.
    op.add_column("plans", sa.Column("pools", sa.Text, nullable=False, server_default="{}"))
    op.add_column("plans", sa.Column("terms", sa.Text, nullable=False, server_default="{}"))
    op.add_column("instance_history", sa.Column("code", sa.String(32), nullable=True))
    op.create_index("ix_history_at", "instance_history", ["at"])
    op.add_column("pools", sa.Column("up_since", sa.Float, nullable=True))
    op.create_table(
        "partition_intents",
        sa.Column("partition", sa.String(128), primary_key=True),
        sa.Column("intent", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("requested_by", sa.String(255), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("partition_intents")
    op.drop_column("pools", "up_since")
    op.drop_index("ix_history_at", "instance_history")
    op.drop_column("instance_history", "code")
    op.drop_column("plans", "terms")
    op.drop_column("plans", "pools")
