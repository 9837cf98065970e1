"""Create the store's tables: deployments, exchanges, health_samples, incidents, reports, drops.

On PostgreSQL ``exchanges`` (by ``sent_at``) and ``health_samples`` (by ``ts``) are declared
``PARTITION BY RANGE``; their daily partitions are created at run time by
``storage.partitions.ensure_partitions`` (and by the writers for every day they see). Their
``deployment`` column has no foreign key (it costs ~20% of the bulk insert time); the writers
create the ``deployments`` row in the same transaction instead. ``exchanges.itl_s`` is
``double precision[]`` there (a JSON array on SQLite): the server stores the floats as they
come instead of parsing each one as a jsonb numeric.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonDoc = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
FloatList = sa.JSON().with_variant(postgresql.ARRAY(postgresql.DOUBLE_PRECISION()), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def _compress_lz4(table: str, columns: list[str]) -> None:
    """PostgreSQL >= 14: compress large values with lz4 (several times faster than the default
    pglz on the write path). Partitions created later inherit it. Skipped where the server was
    built without lz4."""
    if op.get_bind().dialect.name != "postgresql":
        return
    alters = ", ".join(f"ALTER COLUMN {c} SET COMPRESSION lz4" for c in columns)
    op.execute(
        "DO $$ BEGIN"
        f" EXECUTE 'ALTER TABLE {table} {alters}';"
        " EXCEPTION WHEN feature_not_supported OR syntax_error THEN"
        f" RAISE NOTICE 'lz4 compression not available, {table} keeps the default';"
        " END $$"
    )


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("incumbent_engine", sa.Text()),
        sa.Column("incumbent_version", sa.Text()),
        sa.Column("candidate_engine", sa.Text()),
        sa.Column("candidate_version", sa.Text()),
        sa.Column("model", sa.Text()),
        sa.Column("hardware", sa.Text()),
        sa.Column("started_at", Timestamp),
        sa.Column("ended_at", Timestamp),
        sa.Column("policy", JsonDoc),
        sa.Column("created_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_deployments"),
    )

    op.create_table(
        "exchanges",
        sa.Column("pair_id", sa.Uuid(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("sent_at", Timestamp, nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("schema_version", sa.SmallInteger(), nullable=False),
        sa.Column("engine", sa.String(200), nullable=False),
        sa.Column("endpoint", sa.String(16), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("model", sa.Text()),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.Column("ttft_s", sa.Float()),
        sa.Column("e2e_s", sa.Float()),
        sa.Column("tpot_s", sa.Float()),
        sa.Column("itl_s", FloatList, nullable=False),
        sa.Column("prompt_tokens", sa.Integer()),
        sa.Column("completion_tokens", sa.Integer()),
        sa.Column("finish_reason", sa.Text()),
        sa.Column("request", JsonDoc, nullable=False),
        sa.Column("rewrites", JsonDoc, nullable=False),
        sa.Column("output_text", sa.Text()),
        sa.Column("logprobs", JsonDoc),
        sa.Column("inflight_incumbent", sa.Integer()),
        sa.Column("inflight_candidate", sa.Integer()),
        sa.Column("guard", JsonDoc, nullable=False),
        sa.Column("ingested_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("pair_id", "role", "sent_at", name="pk_exchanges"),
        postgresql_partition_by="RANGE (sent_at)",
    )
    _compress_lz4("exchanges", ["request", "output_text", "logprobs", "itl_s", "error"])
    op.create_index("ix_exchanges_deployment_sent_at", "exchanges", ["deployment", "sent_at"])
    op.create_index(
        "ix_exchanges_deployment_role_sent_at", "exchanges", ["deployment", "role", "sent_at"]
    )

    op.create_table(
        "health_samples",
        sa.Column("engine", sa.String(200), nullable=False),
        sa.Column("ts", Timestamp, nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("schema_version", sa.SmallInteger(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("flavor", sa.String(16), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("http_status", sa.Integer()),
        sa.Column("latency_s", sa.Float()),
        sa.Column("error", sa.Text()),
        sa.Column("version", sa.Text()),
        sa.Column("process_start_time", sa.Float()),
        sa.Column("num_running", sa.Integer()),
        sa.Column("num_waiting", sa.Integer()),
        sa.Column("kv_cache_usage", sa.Float()),
        sa.Column("gpu_mem_bytes", sa.BigInteger()),
        sa.Column("cpu_mem_bytes", sa.BigInteger()),
        sa.Column("metrics", JsonDoc, nullable=False),
        sa.Column("ingested_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("engine", "ts", name="pk_health_samples"),
        postgresql_partition_by="RANGE (ts)",
    )
    _compress_lz4("health_samples", ["metrics", "error"])
    op.create_index(
        "ix_health_samples_deployment_engine_ts",
        "health_samples",
        ["deployment", "engine", "ts"],
    )

    op.create_table(
        "incidents",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("engine", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("ended_at", Timestamp),
        sa.Column("evidence", JsonDoc, nullable=False),
        sa.Column("detected_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
        sa.ForeignKeyConstraint(
            ["deployment"], ["deployments.name"], name="fk_incidents_deployment_deployments"
        ),
        sa.UniqueConstraint(
            "deployment",
            "engine",
            "kind",
            "started_at",
            name="uq_incidents_deployment_engine_kind_started_at",
        ),
    )

    op.create_table(
        "reports",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(200), nullable=False),
        sa.Column("created_at", Timestamp, server_default=sa.func.now(), nullable=False),
        sa.Column("window_from", Timestamp, nullable=False),
        sa.Column("window_to", Timestamp, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("body", JsonDoc, nullable=False),
        sa.Column("html", sa.Text()),
        sa.PrimaryKeyConstraint("id", name="pk_reports"),
        sa.ForeignKeyConstraint(
            ["deployment"], ["deployments.name"], name="fk_reports_deployment_deployments"
        ),
    )
    op.create_index("ix_reports_deployment_created_at", "reports", ["deployment", "created_at"])

    op.create_table(
        "drops",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("ts", Timestamp, nullable=False),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_drops"),
    )
    op.create_index("ix_drops_ts", "drops", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_drops_ts", table_name="drops")
    op.drop_table("drops")
    op.drop_index("ix_reports_deployment_created_at", table_name="reports")
    op.drop_table("reports")
    op.drop_table("incidents")
    op.drop_index("ix_health_samples_deployment_engine_ts", table_name="health_samples")
    # On PostgreSQL dropping a partitioned table drops its partitions with it.
    op.drop_table("health_samples")
    op.drop_index("ix_exchanges_deployment_role_sent_at", table_name="exchanges")
    op.drop_index("ix_exchanges_deployment_sent_at", table_name="exchanges")
    op.drop_table("exchanges")
    op.drop_table("deployments")
