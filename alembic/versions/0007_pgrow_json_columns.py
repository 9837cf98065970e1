"""``exchanges.request`` and ``exchanges.logprobs`` as ``json`` instead of ``jsonb`` (issue 15).

PostgreSQL parses a ``jsonb`` value into its binary tree on every insert; ``json`` is the text,
checked to be JSON. The two large JSON columns are read whole (the API, the evaluator's sampled
pairs) or by a few keys (``->``, ``->>``, ``#>>``, which ``json`` has too), never by ``@>`` or
a GIN index, so the tree bought nothing. On the ingest bench's records PostgreSQL's CPU per row
went from 50-52 to 45-47 µs without logprobs and from 775-807 to 265-267 µs with the mirror's
default of 5 top logprobs a token on the candidate's and the replay's records, for 2-12 % fewer
bytes (``bench/store_schema.py``, ``ingester/README.md``). The small ``rewrites`` and ``guard``
stay ``jsonb`` (the rollup refresh reads ``guard->>'state'`` of every row).

Changing a column's type rewrites every ``exchanges`` partition under an exclusive lock: writes
wait until it is done (the ingesters hold their Kafka offsets meanwhile). It also resets the
columns' compression to the server's default, so the rewrite and every table are set to lz4
again, as 0001 set them. The writers of this
version write either type (``storage.write`` asks the table), so upgrade them first, then run
the migration; writers of an older version cannot write ``json`` columns.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 09:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("request", "logprobs")


def _retype(pg_type: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite keeps JSON as text either way
    # The type change rewrites the values and resets the columns' compression to the server's
    # default (pglz), on the parent and on every partition: the rewrite compresses with lz4
    # (this transaction's default), and lz4 is set again on each table, as 0001 set it (a
    # partitioned table's SET COMPRESSION does not reach its partitions; partitions made later
    # take the parent's). Where the server has no lz4, the default stays.
    op.execute(
        "DO $$ BEGIN PERFORM set_config('default_toast_compression', 'lz4', true);"
        " EXCEPTION WHEN invalid_parameter_value OR feature_not_supported THEN"
        " RAISE NOTICE 'lz4 compression not available, exchanges keeps the default';"
        " END $$"
    )
    op.execute(
        "ALTER TABLE exchanges "
        + ", ".join(f"ALTER COLUMN {c} TYPE {pg_type} USING {c}::{pg_type}" for c in COLUMNS)
    )
    alters = ", ".join(f"ALTER COLUMN {c} SET COMPRESSION lz4" for c in COLUMNS)
    op.execute(
        "DO $$ DECLARE t text; BEGIN"
        " FOR t IN SELECT 'exchanges' UNION ALL SELECT inhrelid::regclass::text FROM pg_inherits"
        " WHERE inhparent = 'exchanges'::regclass LOOP"
        f" EXECUTE 'ALTER TABLE ' || t || ' {alters}';"
        " END LOOP;"
        " EXCEPTION WHEN feature_not_supported OR syntax_error THEN"
        " RAISE NOTICE 'lz4 compression not available, exchanges keeps the default';"
        " END $$"
    )


def upgrade() -> None:
    _retype("json")


def downgrade() -> None:
    _retype("jsonb")
