"""Failures reach clients as problem details: store down or not migrated, no-auth mode."""

from __future__ import annotations

from api_seed import DEP, READ_TOKEN, TOKENS, bearer
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.app import create_app
from api.auth import TokenAuth
from api.db import make_readonly_engine
from api.settings import parse_token_map


def client_on(engine: Engine, tokens: bool = True) -> TestClient:
    auth = TokenAuth(parse_token_map(TOKENS, "t") if tokens else None)
    return TestClient(create_app(engine, auth))


def test_unreachable_store_is_503(unused_port: int) -> None:
    engine = make_readonly_engine(f"postgresql://nobody@127.0.0.1:{unused_port}/none")
    try:
        with client_on(engine) as c:
            health = c.get("/healthz")
            assert health.status_code == 503
            assert health.json() == {"status": "unavailable", "database": "unreachable"}
            r = c.get("/v1/deployments", headers=bearer(READ_TOKEN))
    finally:
        engine.dispose()
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/problem+json"
    assert "unreachable" in r.json()["detail"]
    assert "127.0.0.1" not in r.text  # no connection details to clients


def test_unmigrated_store_is_503_saying_what_to_run(empty_pg_url: str) -> None:
    engine = make_readonly_engine(empty_pg_url)
    try:
        with client_on(engine) as c:
            r = c.get(f"/v1/deployments/{DEP}", headers=bearer(READ_TOKEN))
            health = c.get("/healthz")
    finally:
        engine.dispose()
    assert r.status_code == 503
    assert "shadow-ab db upgrade" in r.json()["detail"]
    assert health.status_code == 200  # reachable; the schema is the operator's next step


def test_no_auth_mode_opens_every_scope(api_engine: Engine) -> None:
    with client_on(api_engine, tokens=False) as c:
        pair = c.get(f"/v1/deployments/{DEP}/pairs/divergent", params={"limit": 1}).json()
    assert pair["items"][0]["incumbent"]["output_text"] is not None


def test_unknown_query_parameter_is_422_naming_it(client: TestClient) -> None:
    r = client.get(
        f"/v1/deployments/{DEP}/incidents", params={"role": "candidate"}, headers=bearer(READ_TOKEN)
    )
    assert r.status_code == 422
    assert "'role'" in r.json()["detail"]
    assert "engine_role" in r.json()["detail"]
