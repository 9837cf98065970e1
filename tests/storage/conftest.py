"""Fixtures of the storage tests: a fresh PostgreSQL database per test, SQLite files in tmp_path.

PostgreSQL is the real server from `shadow-ab services up` (``pg_server_url`` from the shared
conftest fails loudly when it is not running). One template database is migrated to head per
session; each test gets its own copy (``CREATE DATABASE ... TEMPLATE``), dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from storage.db import make_engine, normalize_url
from storage.migrate import upgrade

SESSION_TAG = uuid.uuid4().hex[:8]


def _with_database(url: str, name: str) -> str:
    return make_url(normalize_url(url)).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin(pg_server_url: str) -> Iterator[Engine]:
    """An AUTOCOMMIT engine on the server's maintenance database, for CREATE/DROP DATABASE."""
    engine = make_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.fail(
            f"PostgreSQL at {pg_server_url} is not answering ({exc}): run `shadow-ab services up`",
            pytrace=False,
        )
    yield engine
    with engine.connect() as conn:
        leftovers = conn.execute(
            text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
            {"p": f"shadow_test_{SESSION_TAG}%"},
        ).scalars()
        for name in list(leftovers):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


class PgDatabases:
    """Creates and drops throw-away databases on the test server."""

    def __init__(self, admin: Engine, server_url: str) -> None:
        self.admin = admin
        self.server_url = server_url
        self.count = 0

    def create(self, template: str | None = None) -> tuple[str, str]:
        self.count += 1
        name = f"shadow_test_{SESSION_TAG}_{self.count}"
        with self.admin.connect() as conn:
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
        return name, _with_database(self.server_url, name)

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_databases(pg_admin: Engine, pg_server_url: str) -> PgDatabases:
    return PgDatabases(pg_admin, pg_server_url)


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
