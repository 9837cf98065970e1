"""Fixtures of the API tests: one seeded PostgreSQL store per session (the API only reads) and
TestClients with the test tokens; tests that write use the shared ``pg_url`` (tests/conftest.py).

PostgreSQL is the real server from `shadow-ab services up`; databases are throw-away copies of
the session's migrated template.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from api_seed import TOKENS, seed
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pg_throwaway import SESSION_TAG, PgDatabases
from sqlalchemy import Engine, text

from api.app import create_app
from api.auth import TokenAuth
from api.db import make_readonly_engine
from api.settings import parse_token_map
from shadow_ab.dev.processes import free_port
from storage.db import make_engine


@pytest.fixture(scope="session")
def seeded_url(pg_databases: PgDatabases, pg_template: str) -> Iterator[str]:
    """URL of the session's seeded store (tests must not write to it)."""
    name, url = pg_databases.create(template=pg_template)
    engine = make_engine(url)
    try:
        seed(engine)
    finally:
        engine.dispose()
    yield url
    pg_databases.drop(name)


@pytest.fixture
def unused_port() -> int:
    """A local TCP port nothing listens on."""
    return free_port()


@pytest.fixture(scope="session")
def api_engine(seeded_url: str) -> Iterator[Engine]:
    engine = make_readonly_engine(seeded_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def app(api_engine: Engine) -> FastAPI:
    return create_app(api_engine, TokenAuth(parse_token_map(TOKENS, "test tokens")))


@pytest.fixture(scope="session")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def readonly_role(seeded_url: str, pg_admin: Engine) -> Iterator[str]:
    """A fresh role name for a test that creates a read-only role; dropped afterwards."""
    name = f"shadow_api_ro_{SESSION_TAG}_{uuid.uuid4().hex[:6]}"
    yield name
    owner = make_engine(seeded_url)
    try:
        with owner.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{name}"'))
    finally:
        owner.dispose()
    with pg_admin.connect() as conn:
        conn.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
