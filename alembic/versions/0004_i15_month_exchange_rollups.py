"""Create the exchange rollup tables: per-minute counts, notable exchanges, rolled-up hours.

``exchange_counts`` holds per (deployment, UTC minute, role) how many exchanges were sent, how
many failed, and the first and last send time; ``exchange_notables`` the exchanges incident
detection may need (failed, or slow past the hour's floors) with the columns it reads;
``exchange_parity`` the candidate's exchanges per hour by load bucket and guard state (the load
parity table);
``exchange_rollup_hours`` which hours are done and the floors their notables were kept at. A
month of 10 M pairs is ~90 k count rows and the notables (0.2 % of the rows there): a review
reads these instead of scanning ``exchanges``. Written by
``evaluator.exchange_rollups.refresh_exchange_rollups`` (called by
``evaluator.rollups.refresh_rollups``); hours rolled up before this revision are computed by the
next refresh.

Revision ID: 0004_i15_month
Revises: 0003
Create Date: 2026-12-01 21:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_i15_month"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "exchange_counts",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("minute", Timestamp, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("n_failed", sa.BigInteger(), nullable=False),
        sa.Column("first_sent", Timestamp, nullable=False),
        sa.Column("last_sent", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("deployment", "minute", "role", name="pk_exchange_counts"),
    )
    op.create_table(
        "exchange_notables",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("sent_at", Timestamp, nullable=False),
        sa.Column("pair_id", sa.Uuid(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("engine", sa.String(200), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.Column("ttft_s", sa.Float()),
        sa.Column("e2e_s", sa.Float()),
        sa.Column("max_itl_s", sa.Float()),
        sa.PrimaryKeyConstraint(
            "deployment", "sent_at", "pair_id", "role", name="pk_exchange_notables"
        ),
    )
    op.create_table(
        "exchange_parity",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("sum_incumbent", sa.Float(), nullable=False),
        sa.Column("sum_candidate", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("deployment", "hour", "kind", "key", name="pk_exchange_parity"),
    )
    op.create_table(
        "exchange_rollup_hours",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("n_exchanges", sa.BigInteger(), nullable=False),
        sa.Column("n_notable", sa.BigInteger(), nullable=False),
        sa.Column("stall_floor_s", sa.Float(), nullable=False),
        sa.Column("e2e_floor_s", sa.Float(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("computed_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("deployment", "hour", name="pk_exchange_rollup_hours"),
    )


def downgrade() -> None:
    op.drop_table("exchange_rollup_hours")
    op.drop_table("exchange_parity")
    op.drop_table("exchange_notables")
    op.drop_table("exchange_counts")
