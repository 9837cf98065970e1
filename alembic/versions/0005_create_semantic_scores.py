"""Create ``semantic_scores``: per triad, one embedding model's two cosine similarities.

Written and read by ``evaluator.semantic.analyze_semantic``: a review embeds only the triads of
its sample that no earlier review scored with the same model and cut (``max_chars``), so a daily
look embeds the new day's sample and a re-review embeds nothing. Small: at most a day's sample
(200 triads) per UTC day and model.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "semantic_scores",
        sa.Column("pair_id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("max_chars", sa.Integer(), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("candidate", sa.Float(), nullable=False),
        sa.Column("floor", sa.Float(), nullable=False),
        sa.Column("scored_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("pair_id", "model", "max_chars", name="pk_semantic_scores"),
    )
    op.create_index("ix_semantic_scores_deployment_day", "semantic_scores", ["deployment", "day"])


def downgrade() -> None:
    op.drop_index("ix_semantic_scores_deployment_day", table_name="semantic_scores")
    op.drop_table("semantic_scores")
