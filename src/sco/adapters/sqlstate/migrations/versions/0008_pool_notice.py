"""A pool's notice and cold start kept with it.

Fleet state kept a pool's price and class but not the notice its reclaimer
promises or its cold start. A controller reads pools from fleet state when
discovery no longer lists one its servers are in (`_adopt_undiscovered`), and the
scorer reads them too: from the database such a pool had no notice, so its
drains planned for none, while the in-memory twin kept both (found by the swarm,
issue 40: one seed ran differently on the twin and on SQLite). A pool written
before this revision reads as having no notice until discovery writes it again,
which every replica does at start.

- notice_s: seconds of notice before a reclaim (0: none).
- cold_start_s: seconds from create to a ready node, when known.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.add_column(sa.Column("notice_s", sa.Float, nullable=False, server_default="0"))
        batch.add_column(sa.Column("cold_start_s", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.drop_column("cold_start_s")
        batch.drop_column("notice_s")
