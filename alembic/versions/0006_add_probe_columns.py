"""Mark synthetic exchanges: the mirror's probes (issue 12).

``exchanges.synthetic`` is ``probe`` for an exchange of the mirror's probe traffic (sent to
both engines, never to a client) and NULL for client traffic; ``exchanges.probe_id`` names the
probe (``<probe set digest>:<probe id>``, shadow_ab/probes.py). A partial index on the probes
keeps the evaluator's probe scoring from scanning the client traffic around them. Both columns
are nullable: existing rows are client traffic, and adding them rewrites nothing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 21:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PROBES_ONLY = "synthetic IS NOT NULL"


def upgrade() -> None:
    op.add_column("exchanges", sa.Column("synthetic", sa.String(16), nullable=True))
    op.add_column("exchanges", sa.Column("probe_id", sa.String(200), nullable=True))
    op.create_index(
        "ix_exchanges_synthetic_deployment_sent_at",
        "exchanges",
        ["deployment", "sent_at"],
        postgresql_where=sa.text(PROBES_ONLY),
        sqlite_where=sa.text(PROBES_ONLY),
    )


def downgrade() -> None:
    op.drop_index("ix_exchanges_synthetic_deployment_sent_at", table_name="exchanges")
    op.drop_column("exchanges", "probe_id")
    op.drop_column("exchanges", "synthetic")
