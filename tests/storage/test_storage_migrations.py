"""Migrations: up from empty, down to base, up again; models agree with the migrated schema."""

from __future__ import annotations

import uuid
from datetime import timedelta

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from factories import T0, full_exchange
from sqlalchemy import Engine, inspect, text

from storage.db import make_engine
from storage.migrate import current, downgrade, head, include_name, upgrade
from storage.models import Base
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

TABLES = {"deployments", "exchanges", "health_samples", "incidents", "reports", "drops"}
ROLLUP_TABLES = {"latency_rollups", "latency_rollup_hours", "latency_samples"}  # 0003
EXCHANGE_ROLLUP_TABLES = {  # 0004
    "exchange_counts",
    "exchange_notables",
    "exchange_parity",
    "exchange_rollup_hours",
}
HEAD = "0004_i15_month"


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        names = set(inspect(engine).get_table_names()) - {"alembic_version"}
        return {n for n in names if "_p2" not in n}
    finally:
        engine.dispose()


def _views(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_view_names())
    finally:
        engine.dispose()


def _diff(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_name": include_name}
        )
        return list(compare_metadata(ctx, Base.metadata))


def _up_down_up(url: str) -> None:
    assert current(url) is None
    upgrade(url)
    assert current(url) == head() == HEAD
    assert _tables(url) == TABLES | ROLLUP_TABLES | EXCHANGE_ROLLUP_TABLES
    assert _views(url) == {"pairs"}

    downgrade(url, "0003")
    assert _tables(url) == TABLES | ROLLUP_TABLES

    downgrade(url, "0002")
    assert _tables(url) == TABLES
    assert _views(url) == {"pairs"}

    downgrade(url, "0001")
    assert _views(url) == set()
    assert _tables(url) == TABLES

    downgrade(url, "base")
    assert current(url) is None
    assert _tables(url) == set()

    upgrade(url)
    assert current(url) == HEAD
    assert _tables(url) == TABLES | ROLLUP_TABLES | EXCHANGE_ROLLUP_TABLES
    assert _views(url) == {"pairs"}


def test_up_down_up_sqlite(empty_sqlite_url: str) -> None:
    _up_down_up(empty_sqlite_url)


def test_up_down_up_postgres(empty_pg_url: str) -> None:
    _up_down_up(empty_pg_url)


def test_downgrade_postgres_drops_partitions_with_data(empty_pg_url: str) -> None:
    upgrade(empty_pg_url)
    engine = make_engine(empty_pg_url)
    try:
        ensure_partitions(engine, T0, days_ahead=2)
        assert write_exchanges(engine, [full_exchange(sent_at=T0 + timedelta(days=1))]) == 1
    finally:
        engine.dispose()
    downgrade(empty_pg_url, "base")
    engine = make_engine(empty_pg_url)
    try:
        assert inspect(engine).get_table_names() == ["alembic_version"]
    finally:
        engine.dispose()


def test_models_match_migrations_sqlite(sqlite_engine: Engine) -> None:
    assert _diff(sqlite_engine) == []


def test_models_match_migrations_postgres(pg_engine: Engine) -> None:
    ensure_partitions(pg_engine, T0, days_ahead=1)  # partitions must not show up as a diff
    assert _diff(pg_engine) == []


def test_postgres_big_tables_are_partitioned_by_day(pg_engine: Engine) -> None:
    with pg_engine.connect() as conn:
        keys: dict[str, str] = dict(
            conn.execute(
                text(
                    "SELECT c.relname, pg_get_partkeydef(c.oid) FROM pg_class c"
                    " WHERE c.relkind = 'p'"
                )
            ).all()
        )
    assert keys == {"exchanges": "RANGE (sent_at)", "health_samples": "RANGE (ts)"}


def _pairs_view_rows(engine: Engine) -> dict[str, dict[str, object]]:
    pair_a, pair_b = uuid.UUID(int=1), uuid.UUID(int=2)
    records = [
        full_exchange(pair_id=pair_a, role="incumbent", output_text="hello", ttft_s=0.05),
        full_exchange(pair_id=pair_a, role="candidate", output_text="hullo", ttft_s=0.07),
        full_exchange(
            pair_id=pair_a, role="replay", output_text="hello", sent_at=T0 + timedelta(seconds=1)
        ),
        full_exchange(pair_id=pair_b, role="incumbent", status="timeout", output_text=None),
    ]
    assert write_exchanges(engine, records) == 4
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM pairs ORDER BY n_exchanges DESC")).mappings().all()
    return {str(r["n_exchanges"]): dict(r) for r in rows}


def test_pairs_view_one_row_per_pair(store: Engine) -> None:
    rows = _pairs_view_rows(store)
    assert set(rows) == {"3", "1"}
    full, lone = rows["3"], rows["1"]
    assert full["incumbent_output_text"] == "hello"
    assert full["candidate_output_text"] == "hullo"
    assert full["replay_output_text"] == "hello"
    assert full["incumbent_ttft_s"] == 0.05
    assert full["candidate_ttft_s"] == 0.07
    assert full["candidate_engine"] == "trtllm@candidate"
    assert full["deployment"] == "dep-a"
    assert lone["incumbent_status"] == "timeout"
    assert lone["candidate_status"] is None
    assert lone["replay_status"] is None
    expected = {"pair_id", "deployment", "sent_at", "endpoint", "model", "n_exchanges"} | {
        f"{role}_{col}"
        for role in ("incumbent", "candidate", "replay")
        for col in (
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
    }
    assert set(full) == expected


def test_concurrent_upgrades_postgres(empty_pg_url: str) -> None:
    """Processes starting together may all run `upgrade`: they take turns (Alembic itself is not
    thread-safe, hence separate processes)."""
    import subprocess
    import sys

    code = "import sys; from storage.migrate import upgrade; upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, empty_pg_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert current(empty_pg_url) == HEAD
