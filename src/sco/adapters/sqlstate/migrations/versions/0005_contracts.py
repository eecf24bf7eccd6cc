"""Node contracts: what each instance's node is told, versioned, with its token's hash.

- contracts: one row per instance, written in the transaction of the transition
  that changes it; `version` is its ETag and grows only when what the node is
  told changes. The node's token is kept only as a SHA-256 hash. The node's
  acknowledgement (drained, left, failed) names the version it answers.
- contract_changes: every change of a contract (a new version, a token set or
  revoked), in order, so the distributor's replicas keep their copy of the
  contracts current and wake the agents waiting on exactly those that changed.
  Rows older than an hour are pruned; a replica that could not read it reloads.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "contracts",
        sa.Column("instance_id", sa.String(64), primary_key=True),
        sa.Column("partition", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("capacity_class", sa.String(16), nullable=False),
        sa.Column("plan_generation", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("server_id", sa.String(64)),
        sa.Column("drain_by", sa.Float),
        sa.Column("reclaim", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("changed_at", sa.Float, nullable=False),
        sa.Column("token_hash", sa.String(64)),
        sa.Column("token_expires_at", sa.Float),
        sa.Column("ack_version", sa.Integer),
        sa.Column("ack_status", sa.String(16)),
        sa.Column("ack_detail", sa.Text),
        sa.Column("ack_at", sa.Float),
    )
    op.create_index("ix_contracts_token", "contracts", ["token_hash"], unique=True)
    op.create_index("ix_contracts_partition", "contracts", ["partition"])
    op.create_table(
        "contract_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("contract_changes")
    op.drop_index("ix_contracts_partition", "contracts")
    op.drop_index("ix_contracts_token", "contracts")
    op.drop_table("contracts")
