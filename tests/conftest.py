"""Shared test set-up: the connection settings of the real local services.

Tests that need Kafka or PostgreSQL use the servers that `shadow-ab services up` started; their
addresses come from the SHADOW_AB_* environment or from the env file that command writes. A test
that needs a service which is not running fails with a message saying how to start it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pg_throwaway import SESSION_TAG, PgDatabases
from sqlalchemy import Engine, text

from shadow_ab.dev.services.base import port_open
from shadow_ab.settings import services_env_file
from storage.db import make_engine


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
