"""Hostile queries (issue 14, finding 7): a window of centuries, times at the ends of the
calendar and crafted cursors are 422 problems saying what to ask instead, never a 500 or an
answer that grows with the window; every error the API answers is problem+json (RFC 9457);
``--no-auth`` is refused on an address other clients can reach."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from api_seed import DEP, ONLY_CONTENT_TOKEN, READ_TOKEN, bearer
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import incidents as api_incidents
from api.cli import api
from api.incidents import MAX_BUCKETS
from api.settings import is_loopback

COMPARE = f"/v1/deployments/{DEP}/incidents/compare"
LIST = f"/v1/deployments/{DEP}/incidents"
PAIRS = f"/v1/deployments/{DEP}/pairs/divergent"


def assert_problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.headers
    body = r.json()
    assert isinstance(body, dict)
    assert {"type", "title", "status", "detail"} <= set(body), body
    assert body["status"] == status and body["title"] and body["detail"]
    return body


def test_a_300_year_compare_by_day_is_422_saying_the_maximum_and_how_to_ask(
    client: TestClient,
) -> None:
    r = client.get(
        COMPARE,
        params={"since": "1990-01-01T00:00:00Z", "until": "2290-01-01T00:00:00Z", "by": "day"},
        headers=bearer(READ_TOKEN),
    )
    detail = str(assert_problem(r, 422)["detail"])
    assert str(MAX_BUCKETS) in detail and "by=week" in detail and "since/until" in detail
    assert len(r.content) < 2000  # the refusal, not a 38 MB answer

    r = client.get(
        COMPARE,
        params={"since": "1990-01-01T00:00:00Z", "until": "2290-01-01T00:00:00Z", "by": "week"},
        headers=bearer(READ_TOKEN),
    )
    assert "since/until" in str(assert_problem(r, 422)["detail"])


def test_compare_at_the_bucket_limit_is_served(client: TestClient) -> None:
    r = client.get(
        COMPARE,
        params={"since": "2026-01-01T00:00:00Z", "until": "2026-12-31T00:00:00Z", "by": "day"},
        headers=bearer(READ_TOKEN),
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["buckets"]) <= MAX_BUCKETS


@pytest.mark.parametrize("path", [COMPARE, LIST, PAIRS])
@pytest.mark.parametrize(
    "since", ["0001-01-01", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59", "1969-12-31"]
)
def test_times_at_the_ends_of_the_calendar_are_422(
    client: TestClient, path: str, since: str
) -> None:
    r = client.get(path, params={"since": since}, headers=bearer(READ_TOKEN))
    detail = str(assert_problem(r, 422)["detail"])
    assert "since" in detail


@pytest.mark.parametrize(
    "raw",
    [
        f"0001-01-01T00:00:00+00:00|{uuid.UUID(int=1)}",
        f"9999-12-31T23:59:59.999999+00:00|{uuid.UUID(int=1)}",
        f"0001-01-01T00:30:00+01:00|{uuid.UUID(int=1)}",
        "2026-11-02T09:00:00+00:00|not-a-uuid",
        "\udcff",
    ],
)
def test_crafted_cursors_are_422(client: TestClient, raw: str) -> None:
    cursor = base64.urlsafe_b64encode(raw.encode(errors="surrogateescape")).decode().rstrip("=")
    r = client.get(PAIRS, params={"cursor": cursor}, headers=bearer(READ_TOKEN))
    assert "next_cursor" in str(assert_problem(r, 422)["detail"])


def test_every_error_is_problem_json(
    client: TestClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_problem(client.get(f"/v1/deployments/{DEP}"), 401)
    assert_problem(client.get(f"/v1/deployments/{DEP}", headers=bearer("x" * 20)), 401)
    assert_problem(client.get(f"/v1/deployments/{DEP}", headers=bearer(ONLY_CONTENT_TOKEN)), 403)
    assert_problem(client.get("/v1/deployments/nope", headers=bearer(READ_TOKEN)), 404)
    assert_problem(client.get("/no/such/path"), 404)
    assert_problem(client.post("/v1/deployments", headers=bearer(READ_TOKEN)), 405)
    assert_problem(client.get(LIST, params={"kind": "x"}, headers=bearer(READ_TOKEN)), 422)

    def broken(*args: object, **kwargs: object) -> None:
        raise OverflowError("date value out of range")

    monkeypatch.setattr(api_incidents.q, "compare_incidents", broken)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get(COMPARE, headers=bearer(READ_TOKEN))
    body = assert_problem(r, 500)
    assert "OverflowError" not in r.text and "Traceback" not in r.text
    assert "log" in str(body["detail"])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "api.example.com"])
def test_no_auth_is_refused_on_a_reachable_address(host: str) -> None:
    result = CliRunner().invoke(api, ["--no-auth", "--host", host])
    assert result.exit_code == 2
    assert "--no-auth" in result.output and "127.0.0.1" in result.output
    assert "SHADOW_AB_API_TOKENS" in result.output


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.1", "example.com"))
