"""Errors: unreachable stores are transient (StoreUnavailable), the rest permanent."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from factories import exchanges, full_health
from sqlalchemy import Engine

from shadow_ab.dev.processes import free_port
from storage.db import make_engine
from storage.errors import (
    BadConfiguration,
    SchemaMissing,
    StorageError,
    StoreError,
    StoreUnavailable,
)
from storage.migrate import current, upgrade
from storage.write import write_drops, write_exchanges, write_health

WRITES: list[Callable[[Engine], object]] = [
    lambda e: write_exchanges(e, exchanges(2)),
    lambda e: write_health(e, [full_health()]),
    lambda e: write_drops(e, "mirror", "queue_full", 1, datetime.now(UTC)),
]


@pytest.mark.parametrize("write", WRITES, ids=["exchanges", "health", "drops"])
def test_unreachable_postgres_is_store_unavailable(write: Callable[[Engine], object]) -> None:
    engine = make_engine(f"postgresql+psycopg://shadow@127.0.0.1:{free_port()}/shadow_ab")
    try:
        with pytest.raises(StoreUnavailable, match="cannot reach the database") as info:
            write(engine)
    finally:
        engine.dispose()
    assert not isinstance(info.value, StoreError)
    assert isinstance(info.value, StorageError)
    assert info.value.__cause__ is not None


def test_unreachable_postgres_for_migrations() -> None:
    url = f"postgresql://shadow@127.0.0.1:{free_port()}/shadow_ab"
    with pytest.raises(StoreUnavailable):
        upgrade(url)
    with pytest.raises(StoreUnavailable):
        current(url)


@pytest.mark.parametrize("write", WRITES, ids=["exchanges", "health", "drops"])
def test_unmigrated_store_says_run_upgrade(
    write: Callable[[Engine], object], empty_pg_url: str, tmp_path: Path
) -> None:
    for url in (empty_pg_url, f"sqlite:///{tmp_path}/empty.db"):
        engine = make_engine(url)
        try:
            with pytest.raises(SchemaMissing, match="shadow-ab db upgrade"):
                write(engine)
        finally:
            engine.dispose()


def test_sqlite_in_a_missing_folder_is_permanent(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/no/such/dir/store.db")
    try:
        with pytest.raises(StoreError, match="folder exists"):
            write_exchanges(engine, exchanges(2))
    finally:
        engine.dispose()


def test_unsupported_url() -> None:
    with pytest.raises(BadConfiguration, match="sqlite:///PATH"):
        make_engine("mysql://root@localhost/db")
