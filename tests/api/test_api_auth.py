"""Bearer tokens and scopes: who gets in, and who sees prompts and outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_seed import (
    CONTENT_TOKEN,
    DEP,
    ONLY_CONTENT_TOKEN,
    PROMPT,
    READ_TOKEN,
    SIDE_BY_SIDE_PAIR,
    bearer,
)
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.cli import api
from api.settings import APISettings, Scope

PAIR_URL = f"/v1/deployments/{DEP}/pairs/{SIDE_BY_SIDE_PAIR}"


def test_no_token_is_401_with_challenge(client: TestClient) -> None:
    r = client.get("/v1/deployments")
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert r.headers["content-type"] == "application/problem+json"
    assert "Authorization: Bearer" in r.json()["detail"]


@pytest.mark.parametrize(
    "header",
    ["Bearer not-a-configured-token-000", f"Bearer {READ_TOKEN}x", f"Basic {READ_TOKEN}"],
)
def test_wrong_token_is_401(client: TestClient, header: str) -> None:
    r = client.get("/v1/deployments", headers={"Authorization": header})
    assert r.status_code == 401
    assert "Bearer" in r.headers["www-authenticate"]


def test_token_without_read_scope_is_403(client: TestClient) -> None:
    r = client.get("/v1/deployments", headers=bearer(ONLY_CONTENT_TOKEN))
    assert r.status_code == 403
    assert "'read'" in r.json()["detail"]
    assert 'error="insufficient_scope"' in r.headers["www-authenticate"]


def test_healthz_and_docs_need_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok"}
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


def test_read_token_sees_no_prompts_or_outputs(client: TestClient) -> None:
    pair = client.get(PAIR_URL, headers=bearer(READ_TOKEN)).json()
    assert pair["prompt"] is None
    assert "messages" not in pair["parameters"]
    assert pair["parameters"]["temperature"] == 0
    for side in pair["sides"].values():
        assert side["output_text"] is None
        assert side["logprobs"] is None
        assert side["ttft_s"] is not None  # timings are `read`
    cand = pair["divergence"]["candidate"]
    assert cand["divergent_tokens"] is None
    assert cand["highlight"] is not None  # offsets without the text
    page = client.get(f"/v1/deployments/{DEP}/pairs/divergent", headers=bearer(READ_TOKEN))
    assert page.json()["items"]
    for item in page.json()["items"]:
        assert item["incumbent"]["output_text"] is None
        assert item["other"]["output_text"] is None
    html = client.get(PAIR_URL, params={"format": "html"}, headers=bearer(READ_TOKEN))
    assert html.status_code == 403
    assert "content" in html.json()["detail"]


def test_content_token_sees_prompts_and_outputs(client: TestClient) -> None:
    pair = client.get(PAIR_URL, headers=bearer(CONTENT_TOKEN)).json()
    assert pair["prompt"] == PROMPT
    assert pair["sides"]["incumbent"]["output_text"].startswith("The answer is 42")
    assert pair["sides"]["candidate"]["logprobs"][0]["token"] == "43"
    assert pair["divergence"]["candidate"]["divergent_tokens"] == ["42", "43"]


def test_settings_refuse_to_start_without_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHADOW_AB_API_TOKENS", raising=False)
    monkeypatch.delenv("SHADOW_AB_API_TOKENS_FILE", raising=False)
    with pytest.raises(ValidationError, match="no API tokens configured"):
        APISettings()
    assert APISettings(api_no_auth=True).token_map == {}
    result = CliRunner().invoke(api, [])
    assert result.exit_code == 2
    assert "no API tokens configured" in result.output


def test_tokens_from_env_and_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHADOW_AB_API_TOKENS", '{"env-token-0123456789": ["read"]}')
    path = tmp_path / "tokens.yaml"
    path.write_text("file-token-0123456789: [read, content]\n")
    monkeypatch.setenv("SHADOW_AB_API_TOKENS_FILE", str(path))
    tokens = APISettings().token_map
    assert tokens == {
        "env-token-0123456789": frozenset({Scope.READ}),
        "file-token-0123456789": frozenset({Scope.READ, Scope.CONTENT}),
    }


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"short": ["read"]}, "at least 16"),
        ({"long-enough-token-123": ["admin"]}, "unknown scope"),
        ({"long-enough-token-123": []}, "non-empty list"),
    ],
)
def test_bad_tokens_are_refused_with_a_reason(tokens: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        APISettings(api_tokens=json.dumps(tokens))


@pytest.mark.parametrize(("value", "message"), [("{not json", "not valid JSON"), ("", "no API")])
def test_tokens_variable_that_is_empty_or_not_json(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("SHADOW_AB_API_TOKENS", value)
    monkeypatch.delenv("SHADOW_AB_API_TOKENS_FILE", raising=False)
    result = CliRunner().invoke(api, [])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_api_database_url_falls_back_to_the_store_url() -> None:
    s = APISettings(api_no_auth=True, database_url="postgresql://u@h:1/store")
    assert s.store_url == "postgresql+psycopg://u@h:1/store"
    s = APISettings(
        api_no_auth=True,
        database_url="postgresql://u@h:1/store",
        api_database_url="postgresql://ro@h:1/store",
    )
    assert s.store_url == "postgresql+psycopg://ro@h:1/store"
