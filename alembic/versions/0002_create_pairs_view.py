"""Create the ``pairs`` view: one row per pair_id, the roles' key columns side by side.

Conditional aggregation (``MAX(CASE WHEN role = ... END)``) rather than self-joins, so a pair is
one row whichever roles it has (incumbent only, candidate only, all three) and the same SQL runs
on PostgreSQL and SQLite.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 03:41:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLES = ("incumbent", "candidate", "replay")
COLUMNS = (
    "engine",
    "status",
    "http_status",
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "output_text",
)


def pairs_view_sql() -> str:
    per_role = ",\n".join(
        f"    MAX(CASE WHEN role = '{role}' THEN {col} END) AS {role}_{col}"
        for role in ROLES
        for col in COLUMNS
    )
    return (
        "CREATE VIEW pairs AS\n"
        "SELECT\n"
        "    pair_id,\n"
        "    deployment,\n"
        "    MIN(sent_at) AS sent_at,\n"
        "    MAX(endpoint) AS endpoint,\n"
        "    MAX(model) AS model,\n"
        "    COUNT(*) AS n_exchanges,\n"
        f"{per_role}\n"
        "FROM exchanges\n"
        "GROUP BY pair_id, deployment"
    )


def upgrade() -> None:
    op.execute(pairs_view_sql())


def downgrade() -> None:
    op.execute("DROP VIEW pairs")
