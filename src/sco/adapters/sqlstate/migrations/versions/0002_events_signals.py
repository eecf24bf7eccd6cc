"""Events and signals: outbox, embedded event log with consumer offsets, dead letters,
exclusions and pool scores.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(128), nullable=False, unique=True),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "event_log",
        sa.Column("offset", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(128), nullable=False, unique=True),
        sa.Column("pool", sa.String(255), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "consumer_offsets",
        sa.Column("consumer", sa.String(128), primary_key=True),
        sa.Column("offset", sa.Integer, nullable=False),
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("consumer", sa.String(128), nullable=False),
        sa.Column("offset", sa.Integer, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
    )
    op.create_table(
        "exclusions",
        sa.Column("pool", sa.String(255), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("since", sa.Float, nullable=False),
        sa.Column("until", sa.Float, nullable=False),
        sa.Column("cooldown_s", sa.Float, nullable=False),
        sa.Column("last_crossing", sa.Float, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "pool_scores",
        sa.Column("generation", sa.Integer, primary_key=True),
        sa.Column("pool", sa.String(255), primary_key=True),
        sa.Column("computed_at", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "pool_scores",
        "exclusions",
        "dead_letters",
        "consumer_offsets",
        "event_log",
        "outbox",
    ):
        op.drop_table(table)
