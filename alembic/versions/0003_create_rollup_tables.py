"""Create the latency rollup tables: hourly sketches, rolled-up hours, sampled pairs.

``latency_rollups`` holds per (deployment, hour, role, metric, slice) a mergeable log-bucketed
sketch (sparse bucket keys and counts as JSON arrays, jsonb on PostgreSQL); ``latency_rollup_hours``
records which hours are done; ``latency_samples`` a bounded random sample of each hour's pairs for
the paired statistics. All three are small next to ``exchanges`` (a month of 10 M pairs is ~100 k
sketch rows and ~1.4 M sample rows) and not partitioned. Written by
``evaluator.rollups.refresh_rollups``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 06:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonDoc = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "latency_rollups",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("slice", sa.String(32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("zero_count", sa.BigInteger(), nullable=False),
        sa.Column("sum", sa.Float(), nullable=False),
        sa.Column("min", sa.Float()),
        sa.Column("max", sa.Float()),
        sa.Column("keys", JsonDoc, nullable=False),
        sa.Column("counts", JsonDoc, nullable=False),
        sa.PrimaryKeyConstraint(
            "deployment", "hour", "role", "metric", "slice", name="pk_latency_rollups"
        ),
    )
    op.create_table(
        "latency_rollup_hours",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("n_pairs", sa.BigInteger(), nullable=False),
        sa.Column("n_sampled", sa.Integer(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("computed_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("deployment", "hour", name="pk_latency_rollup_hours"),
    )
    op.create_table(
        "latency_samples",
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Uuid(), nullable=False),
        sa.Column("sent_at", Timestamp, nullable=False),
        sa.Column("inflight_incumbent", sa.Integer()),
        sa.Column("prompt_tokens", sa.Integer()),
        sa.Column("incumbent_status", sa.String(32), nullable=False),
        sa.Column("candidate_status", sa.String(32), nullable=False),
        sa.Column("incumbent_ttft_s", sa.Float()),
        sa.Column("candidate_ttft_s", sa.Float()),
        sa.Column("incumbent_tpot_s", sa.Float()),
        sa.Column("candidate_tpot_s", sa.Float()),
        sa.Column("incumbent_e2e_s", sa.Float()),
        sa.Column("candidate_e2e_s", sa.Float()),
        sa.Column("incumbent_tokens_per_s", sa.Float()),
        sa.Column("candidate_tokens_per_s", sa.Float()),
        sa.Column("incumbent_itl_mean_s", sa.Float()),
        sa.Column("candidate_itl_mean_s", sa.Float()),
        sa.Column("incumbent_completion_tokens", sa.Integer()),
        sa.Column("candidate_completion_tokens", sa.Integer()),
        sa.PrimaryKeyConstraint("deployment", "hour", "rank", name="pk_latency_samples"),
    )


def downgrade() -> None:
    op.drop_table("latency_samples")
    op.drop_table("latency_rollup_hours")
    op.drop_table("latency_rollups")
