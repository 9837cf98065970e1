"""Fixtures of the storage tests: a fresh PostgreSQL database per test, SQLite files in tmp_path.

PostgreSQL is the real server from `shadow-ab services up` (``pg_server_url`` from the shared
conftest fails loudly when it is not running). One template database is migrated to head per
session; each test gets its own copy (``CREATE DATABASE ... TEMPLATE``), dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_throwaway import PgDatabases
from sqlalchemy import Engine

from storage.db import make_engine
from storage.migrate import upgrade


@pytest.fixture(scope="session")
def pg_template(pg_databases: PgDatabases) -> Iterator[str]:
    """Name of a database migrated to head (no connections left open, so it can be copied)."""
    name, url = pg_databases.create()
    upgrade(url)
    yield name
    pg_databases.drop(name)


@pytest.fixture
def empty_pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """URL of a brand-new, empty PostgreSQL database."""
    name, url = pg_databases.create()
    yield url
    pg_databases.drop(name)


@pytest.fixture
def pg_url(pg_databases: PgDatabases, pg_template: str) -> Iterator[str]:
    """URL of a fresh PostgreSQL database migrated to head."""
    name, url = pg_databases.create(template=pg_template)
    yield url
    pg_databases.drop(name)


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """A migrated store, once on SQLite and once on PostgreSQL."""
    name = "sqlite_engine" if request.param == "sqlite" else "pg_engine"
    result: Engine = request.getfixturevalue(name)
    return result
