"""Node tokens stored before they are delivered, and the token they replace kept
until its own expiry.

A token's digest is stored first (fenced: only the partition's leader stores one),
then the token is delivered through the server's metadata, then the delivery is
marked. A writer that stopped in between leaves a token not marked delivered, which
the next leader issues again after a grace; one that delivers late delivers a token
whose digest is the previous one, which is accepted until it expires: the node never
holds a token the store refuses (issue 40).

- prev_token_hash, prev_token_expires_at: the token replaced by the last one set.
- token_set_at, token_delivered: when the current one was stored, and whether its
  delivery was seen to succeed.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("contracts") as batch:
        batch.add_column(sa.Column("prev_token_hash", sa.String(64)))
        batch.add_column(sa.Column("prev_token_expires_at", sa.Float))
        batch.add_column(sa.Column("token_set_at", sa.Float))
        batch.add_column(
            sa.Column("token_delivered", sa.Boolean, nullable=False, server_default=sa.true())
        )
    op.create_index("ix_contracts_prev_token", "contracts", ["prev_token_hash"])


def downgrade() -> None:
    op.drop_index("ix_contracts_prev_token", "contracts")
    with op.batch_alter_table("contracts") as batch:
        for column in (
            "token_delivered",
            "token_set_at",
            "prev_token_expires_at",
            "prev_token_hash",
        ):
            batch.drop_column(column)
