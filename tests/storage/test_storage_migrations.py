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
SEMANTIC_TABLES = {"semantic_scores"}  # 0005
PROBE_COLUMNS = ("synthetic", "probe_id")  # 0006, on exchanges
HEAD = "0007"


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


def _exchange_columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("exchanges")}
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
    assert _tables(url) == TABLES | ROLLUP_TABLES | EXCHANGE_ROLLUP_TABLES | SEMANTIC_TABLES
    assert _views(url) == {"pairs"}
    assert set(PROBE_COLUMNS) <= _exchange_columns(url)

    downgrade(url, "0005")
    assert not set(PROBE_COLUMNS) & _exchange_columns(url)

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
    assert _tables(url) == TABLES | ROLLUP_TABLES | EXCHANGE_ROLLUP_TABLES | SEMANTIC_TABLES
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


def _json_columns(engine: Engine) -> dict[str, set[tuple[str, str]]]:
    """request and logprobs of exchanges and of each partition: {column: {(type, compression)}}
    (compression l: lz4)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.attname, format_type(a.atttypid, NULL), a.attcompression::text"
                " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                " WHERE (c.relname = 'exchanges' OR c.relname LIKE 'exchanges\\_p2%')"
                " AND c.relkind IN ('r', 'p') AND a.attname IN ('request', 'logprobs')"
            )
        ).all()
    out: dict[str, set[tuple[str, str]]] = {}
    for name, pg_type, compression in rows:
        out.setdefault(name, set()).add((pg_type, compression))
    return out


def _stored_documents(engine: Engine) -> list[tuple[object, object]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT request, logprobs FROM exchanges"))]


def test_json_columns_postgres(empty_pg_url: str) -> None:
    """0007: request and logprobs become json, lz4-compressed on every partition (those there
    and those made later); the rows read back the same either way, and one writer keeps writing
    across the migration and its downgrade (it adapts its values to the table's types)."""
    upgrade(empty_pg_url, "0006")
    engine = make_engine(empty_pg_url)
    try:
        ensure_partitions(engine, T0, days_ahead=1)
        big = full_exchange(sent_at=T0, seed=1, text_bytes=12_000)  # its request compressed
        assert write_exchanges(engine, [big]) == 1  # into jsonb
        assert _json_columns(engine) == {c: {("jsonb", "l")} for c in ("request", "logprobs")}
        before = _stored_documents(engine)
        assert before and before[0][0] and before[0][1]

        upgrade(empty_pg_url)
        ensure_partitions(engine, T0 + timedelta(days=5), days_ahead=0)  # made after 0007
        assert _json_columns(engine) == {c: {("json", "l")} for c in ("request", "logprobs")}
        assert _stored_documents(engine) == before
        with engine.connect() as conn:  # rewritten by the type change, with lz4
            method = conn.execute(text("SELECT pg_column_compression(request) FROM exchanges"))
            assert method.scalar_one() == "lz4"
        # the writer still holds the jsonb types it looked up: refused, it looks again
        assert write_exchanges(engine, [full_exchange(sent_at=T0, seed=2)]) == 1
        assert write_exchanges(engine, [full_exchange(sent_at=T0 + timedelta(days=5))]) == 1

        downgrade(empty_pg_url, "0006")
        assert _json_columns(engine) == {c: {("jsonb", "l")} for c in ("request", "logprobs")}
        assert write_exchanges(engine, [full_exchange(sent_at=T0, seed=3)]) == 1
        after = _stored_documents(engine)
        assert len(after) == 4 and before[0] in after
    finally:
        engine.dispose()
