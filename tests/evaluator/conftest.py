"""Fixtures of the evaluator tests: a migrated PostgreSQL database per test (a copy of one
template migrated per session, as tests/storage does) and a migrated SQLite file in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_throwaway import PgDatabases
from sqlalchemy import Engine

from storage.db import make_engine
from storage.migrate import upgrade


@pytest.fixture(scope="session")
def eval_pg_template(pg_databases: PgDatabases) -> Iterator[str]:
    """Name of a database migrated to head (no connections left open, so it can be copied)."""
    name, url = pg_databases.create()
    upgrade(url)
    yield name
    pg_databases.drop(name)


@pytest.fixture
def pg_engine(pg_databases: PgDatabases, eval_pg_template: str) -> Iterator[Engine]:
    """An engine on a fresh PostgreSQL database migrated to head, dropped afterwards."""
    name, url = pg_databases.create(template=eval_pg_template)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    pg_databases.drop(name)


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    """An engine on a migrated SQLite file."""
    url = f"sqlite:///{tmp_path}/store.db"
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> Engine:
    """A migrated store, once on SQLite and once on PostgreSQL."""
    name = "sqlite_engine" if request.param == "sqlite" else "pg_engine"
    engine: Engine = request.getfixturevalue(name)
    return engine
