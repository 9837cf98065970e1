"""`shadow-ab db ...` on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from factories import exchanges
from sqlalchemy import text

from shadow_ab.cli import main
from shadow_ab.dev.processes import free_port
from storage.db import make_engine
from storage.migrate import head
from storage.partitions import partition_name
from storage.write import write_exchanges


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["db", *args])
    return result.exit_code, result.output


def test_upgrade_current_downgrade_sqlite(empty_sqlite_url: str) -> None:
    newest = head()
    assert run("current", "--database-url", empty_sqlite_url) == (
        0,
        f"not migrated (newest is {newest}): run `shadow-ab db upgrade`\n",
    )
    code, out = run("upgrade", "--database-url", empty_sqlite_url)
    assert (code, out) == (0, f"store at revision {newest}\n")
    assert run("current", "--database-url", empty_sqlite_url) == (0, f"{newest} (head)\n")
    assert run("downgrade", "--database-url", empty_sqlite_url, "--revision", "0001") == (
        0,
        "store at revision 0001\n",
    )
    assert run("current", "--database-url", empty_sqlite_url) == (
        0,
        f"0001 (newest is {newest}: run `shadow-ab db upgrade`)\n",
    )
    assert run("downgrade", "--database-url", empty_sqlite_url, "--revision", "base") == (
        0,
        "store at revision base\n",
    )


def test_upgrade_creates_partitions_postgres(empty_pg_url: str) -> None:
    code, out = run("upgrade", "--database-url", empty_pg_url, "--days-ahead", "1")
    assert code == 0, out
    today = datetime.now(UTC).date()
    assert partition_name("exchanges", today) in out
    assert partition_name("health_samples", today + timedelta(days=1)) in out
    code, out = run("partitions", "--database-url", empty_pg_url, "--days-ahead", "2")
    assert code == 0, out
    assert out.startswith("created 2 partitions: ")
    assert run("partitions", "--database-url", empty_pg_url, "--days-ahead", "2") == (
        0,
        "created 0 partitions\n",
    )


def test_retention_postgres(pg_url: str) -> None:
    engine = make_engine(pg_url)
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    try:
        write_exchanges(engine, exchanges(2, start=today - timedelta(days=5)))
        write_exchanges(engine, exchanges(2, start=today, seed=1))
    finally:
        engine.dispose()
    old = partition_name("exchanges", (today - timedelta(days=5)).date())
    code, out = run("retention", "--database-url", pg_url, "--keep-days", "2", "--dry-run")
    assert code == 0, out
    assert f"would drop partition {old}" in out
    assert "exchanges: would remove 2 rows" in out
    code, out = run("retention", "--database-url", pg_url, "--keep-days", "2")
    assert code == 0, out
    assert f"dropped partition {old}" in out
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM exchanges")).scalar_one() == 2
    finally:
        engine.dispose()


def test_errors_are_one_line_with_an_exit_status(empty_sqlite_url: str) -> None:
    code, out = run("upgrade", "--database-url", f"postgresql://u@127.0.0.1:{free_port()}/x")
    assert code == 3
    assert out.startswith("error: cannot reach the database")
    assert "Traceback" not in out
    code, out = run("upgrade", "--database-url", "mysql://root@localhost/db")
    assert code == 2
    assert "is not supported" in out
    code, out = run("retention", "--database-url", empty_sqlite_url, "--keep-days", "1")
    assert code == 1
    assert "shadow-ab db upgrade" in out
    code, out = run("retention", "--database-url", empty_sqlite_url, "--keep-days", "-1")
    assert code == 2
