"""Leases per partition with fencing tokens, and a fence on every partition-owned row.

A controller may write a partition's instances, reservations and plans only
with the fencing token of that partition's current lease (or a later one).
The database enforces it with triggers, so a controller that lost its lease
(paused, partitioned, slow) cannot write, whatever its own code believes.
Rows written with no lease in force carry fence 0, which passes while no
lease exists for the partition (single-process runs and simulations).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

FENCED = ("instances", "reservations", "plans")
MESSAGE = "stale fencing token"


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("partition", sa.String(128), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    for table in FENCED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("fence", sa.BigInteger, nullable=False, server_default="0"))
    if op.get_bind().dialect.name == "postgresql":
        _postgres_triggers()
    else:
        _sqlite_triggers()


def _sqlite_triggers() -> None:
    for table in FENCED:
        for when in ("INSERT", "UPDATE"):
            op.execute(
                f"CREATE TRIGGER fence_{table}_{when.lower()} BEFORE {when} ON {table} "
                "WHEN NEW.fence < COALESCE("
                "(SELECT token FROM leases WHERE leases.partition = NEW.partition), 0) "
                f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
            )


def _postgres_triggers() -> None:
    op.execute(
        f"""
        CREATE FUNCTION sco_check_fence() RETURNS trigger AS $$
        BEGIN
            IF NEW.fence < COALESCE(
                (SELECT token FROM leases WHERE leases.partition = NEW.partition), 0)
            THEN
                RAISE EXCEPTION '{MESSAGE}: % < current token of partition %',
                    NEW.fence, NEW.partition USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    for table in FENCED:
        op.execute(
            f"CREATE TRIGGER fence_{table} BEFORE INSERT OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION sco_check_fence()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in FENCED:
            op.execute(f"DROP TRIGGER fence_{table} ON {table}")
        op.execute("DROP FUNCTION sco_check_fence()")
    else:
        for table in FENCED:
            for when in ("insert", "update"):
                op.execute(f"DROP TRIGGER fence_{table}_{when}")
    for table in FENCED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("fence")
    op.drop_table("replicas")
    op.drop_table("leases")
