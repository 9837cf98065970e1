"""The API cannot write: read-only sessions on its engine, and a SELECT-only role."""

from __future__ import annotations

import pytest
from api_seed import DEP, READ_TOKEN, TOKENS, bearer
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from api.app import create_app
from api.auth import TokenAuth
from api.db import make_readonly_engine
from api.roles import create_readonly_role
from api.settings import parse_token_map
from storage.db import make_engine
from storage.errors import BadConfiguration

WRITES = [
    "INSERT INTO deployments (name) VALUES ('intruder')",
    "UPDATE deployments SET model = 'x'",
    "DELETE FROM reports",
    "CREATE TABLE scratch (x int)",
]


@pytest.mark.parametrize("sql", WRITES)
def test_api_engine_sessions_are_read_only(api_engine: Engine, sql: str) -> None:
    with api_engine.connect() as conn:
        assert conn.execute(text("SHOW default_transaction_read_only")).scalar_one() == "on"
        with pytest.raises(DBAPIError, match="read-only transaction"):
            conn.execute(text(sql))


def test_readonly_role_can_select_and_nothing_else(seeded_url: str, readonly_role: str) -> None:
    owner = make_engine(seeded_url)
    try:
        shown = create_readonly_role(owner, readonly_role, login=True, password="p:a%ss'w")
        assert any("'***'" in s for s in shown) and not any("p:a%ss" in s for s in shown)
        create_readonly_role(owner, readonly_role, login=True)  # re-running refreshes, no error
    finally:
        owner.dispose()
    url = make_url(seeded_url).set(username=readonly_role, password=None)
    as_role = make_engine(url.render_as_string(hide_password=False))
    try:
        with as_role.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pairs")).scalar_one() > 0
            # Even with the read-only default switched off, privileges refuse every write.
            conn.execute(text("SET default_transaction_read_only = off"))
            conn.commit()
            for sql in WRITES:
                with pytest.raises(DBAPIError, match="permission denied"):
                    conn.execute(text(sql))
                conn.rollback()
    finally:
        as_role.dispose()
    api_engine = make_readonly_engine(url.render_as_string(hide_password=False))
    try:
        app = create_app(api_engine, TokenAuth(parse_token_map(TOKENS, "t")))
        with TestClient(app) as c:
            r = c.get(f"/v1/deployments/{DEP}/pairs/divergent", headers=bearer(READ_TOKEN))
            assert r.status_code == 200 and r.json()["items"]
            r = c.get(f"/v1/deployments/{DEP}/incidents", headers=bearer(READ_TOKEN))
            assert r.status_code == 200 and r.json()["items"]
    finally:
        api_engine.dispose()


def test_role_names_are_checked(seeded_url: str) -> None:
    owner = make_engine(seeded_url)
    try:
        with pytest.raises(BadConfiguration, match="lowercase letters"):
            create_readonly_role(owner, 'x"; DROP TABLE exchanges; --')
        with pytest.raises(BadConfiguration, match="LOGIN"):
            create_readonly_role(owner, "ok_name", password="secret")
    finally:
        owner.dispose()


def test_sqlite_store_is_query_only(sqlite_url: str) -> None:
    engine = make_readonly_engine(sqlite_url)
    try:
        with engine.connect() as conn, pytest.raises(DBAPIError, match="readonly"):
            conn.execute(text(WRITES[0]))
    finally:
        engine.dispose()
