"""The token a node was last seen to receive, accepted until its own expiry.

The current token and the one it replaced were the only ones accepted. A renewal
whose delivery failed (the cloud's API away) left an undelivered token current;
a minute later the next leader stored another, and the replaced one was then the
undelivered token, not the one the node holds: the node's agent was refused until
a delivery went through (found by the swarm, issue 40). Now the last token whose
delivery was seen is kept too.

- delivered_token_hash, delivered_token_expires_at: the token last marked delivered.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("contracts") as batch:
        batch.add_column(sa.Column("delivered_token_hash", sa.String(64)))
        batch.add_column(sa.Column("delivered_token_expires_at", sa.Float))
    op.create_index("ix_contracts_delivered_token", "contracts", ["delivered_token_hash"])
    # A token marked delivered is the one its node holds.
    op.execute(
        "UPDATE contracts SET delivered_token_hash = token_hash, "
        "delivered_token_expires_at = token_expires_at WHERE token_delivered"
    )


def downgrade() -> None:
    op.drop_index("ix_contracts_delivered_token", "contracts")
    with op.batch_alter_table("contracts") as batch:
        batch.drop_column("delivered_token_expires_at")
        batch.drop_column("delivered_token_hash")
