"""Shared test set-up: the real local services, the stores every folder tests against, and the
``services`` marker.

Tests that need Kafka or PostgreSQL use the servers that `shadow-ab services up` started; their
addresses come from the SHADOW_AB_* environment or from the env file that command writes. A test
that needs a service which is not running fails with a message saying how to start it.

Stores: one PostgreSQL database is migrated to head per session (``pg_template``); a test gets
its own copy (``pg_url``, ``pg_engine``: ``CREATE DATABASE ... TEMPLATE``, dropped afterwards)
or a migrated SQLite file in its tmp_path (``sqlite_url``, ``sqlite_engine``); ``store`` runs a
test once on each. ``empty_pg_url`` / ``empty_sqlite_url`` are stores not migrated at all.

Every test that uses a service fixture (directly or through the fixtures it uses) is marked
``services`` at collection, so ``pytest -m "not services"`` runs the rest without Kafka or
PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_throwaway import SESSION_TAG, PgDatabases
from sqlalchemy import Engine, text

from shadow_ab.dev.services.base import port_open
from shadow_ab.settings import services_env_file
from storage.db import make_engine
from storage.migrate import upgrade

# Fixtures that reach a real server: the shared ones `shadow-ab services up` started, and the
# throw-away ones a few tests start from those servers' installs. Fixtures built on them need
# no entry here: a test's ``fixturenames`` holds every fixture it uses, however indirectly.
SERVICE_FIXTURES = frozenset(
    {"pg_server_url", "kafka_bootstrap", "private_pg_root", "throwaway_kafka"}
)
# Parametrised fixtures that reach a server only with some of their params (fetched with
# ``getfixturevalue``, so not in ``fixturenames``): fixture name -> those params.
SERVICE_PARAMS = {"store": frozenset({"postgresql"})}


def needs_services(item: pytest.Item) -> bool:
    """Whether ``item`` uses Kafka or PostgreSQL, by the fixtures and params it uses."""
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(params.get(name) in values for name, values in SERVICE_PARAMS.items())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_services(item):
            item.add_marker(pytest.mark.services)


def _load_services_env() -> None:
    path = services_env_file()
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("SHADOW_AB_"):
            os.environ.setdefault(key, value)


_load_services_env()


def _require(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} is not set: run `shadow-ab services up` first", pytrace=False)
    return value


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """URL of the running local PostgreSQL (its `shadow_ab` database)."""
    url = _require("SHADOW_AB_DATABASE_URL")
    if not url.startswith("postgresql"):
        pytest.fail(f"SHADOW_AB_DATABASE_URL={url} is not PostgreSQL", pytrace=False)
    return url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """HOST:PORT of the running local Kafka broker."""
    bootstrap = _require("SHADOW_AB_KAFKA_BOOTSTRAP")
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not port_open(int(port), host):
        pytest.fail(
            f"Kafka at {bootstrap} is not accepting: run `shadow-ab services up`", pytrace=False
        )
    return bootstrap


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


@pytest.fixture(scope="session")
def pg_databases(pg_admin: Engine, pg_server_url: str) -> PgDatabases:
    return PgDatabases(pg_admin, pg_server_url)


# -- stores -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_template(pg_databases: PgDatabases) -> Iterator[str]:
    """Name of a database migrated to head once per session, with no connection left open so
    that it can be copied."""
    name, url = pg_databases.create()
    upgrade(url)
    yield name
    pg_databases.drop(name)


@pytest.fixture
def pg_url(pg_databases: PgDatabases, pg_template: str) -> Iterator[str]:
    """URL of a fresh PostgreSQL database migrated to head (a copy of the template)."""
    name, url = pg_databases.create(template=pg_template)
    yield url
    pg_databases.drop(name)


@pytest.fixture
def empty_pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """URL of a brand-new, empty PostgreSQL database (not migrated)."""
    name, url = pg_databases.create()
    yield url
    pg_databases.drop(name)


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def empty_sqlite_url(tmp_path: Path) -> str:
    """URL of a SQLite file in tmp_path that does not exist yet."""
    return f"sqlite:///{tmp_path}/store.db"


@pytest.fixture
def sqlite_url(empty_sqlite_url: str) -> str:
    """URL of a SQLite file in tmp_path, migrated to head."""
    upgrade(empty_sqlite_url)
    return empty_sqlite_url


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def store(request: pytest.FixtureRequest) -> Engine:
    """A migrated store, once on PostgreSQL and once on SQLite (``store.url`` is its URL)."""
    engine: Engine = request.getfixturevalue(
        "pg_engine" if request.param == "postgresql" else "sqlite_engine"
    )
    return engine
