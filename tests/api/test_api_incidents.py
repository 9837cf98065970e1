"""Incidents through the API are exactly what evaluator.incidents.query gives the CLI."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from api_seed import DEP, INCIDENTS, READ_TOKEN, T0, bearer
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.incidents import finite
from api.models import Incident, IncidentComparison
from evaluator.incidents.query import compare_incidents, query_incidents

READ = bearer(READ_TOKEN)
URL = f"/v1/deployments/{DEP}/incidents"


def as_json(model: Any) -> Any:
    return model.model_dump(mode="json")


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"engine_role": "candidate"},
        {"engine_role": "incumbent", "kind": "crash"},
        {"kind": "leak"},
        {"since": T0 + timedelta(hours=4), "until": T0 + timedelta(days=3)},
    ],
)
def test_list_matches_the_evaluator_query(
    client: TestClient, api_engine: Engine, filters: dict[str, Any]
) -> None:
    params = {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in filters.items()}
    r = client.get(URL, params=params, headers=READ)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    expected = query_incidents(api_engine, DEP, **filters)
    assert items == [as_json(Incident.model_validate(finite(row))) for row in expected]
    # ...and that is what was stored, filtered by the same rules.
    stored = [
        (eng, kind)
        for eng, kind, start in INCIDENTS
        if filters.get("engine_role") in (None, eng.split("@")[1])
        and filters.get("kind") in (None, kind)
        and filters.get("since", start) <= start < filters.get("until", start + timedelta(1))
    ]
    assert [(i["engine"], i["kind"]) for i in items] == stored


@pytest.mark.parametrize("by", ["day", "week"])
def test_compare_matches_the_evaluator(client: TestClient, api_engine: Engine, by: str) -> None:
    r = client.get(f"{URL}/compare", params={"by": by}, headers=READ)
    assert r.status_code == 200, r.text
    body = r.json()
    expected = compare_incidents(api_engine, DEP, by=by)  # type: ignore[arg-type]
    assert body == as_json(IncidentComparison.model_validate(finite(expected)))
    assert body["roles"]["candidate"]["count"] == 4
    assert body["roles"]["incumbent"]["count"] == 1
    # An explicit window past the last incident (the default one ends at its start).
    params = {"by": by, "since": T0.isoformat(), "until": (T0 + timedelta(days=10)).isoformat()}
    body = client.get(f"{URL}/compare", params=params, headers=READ).json()
    assert sum(b["candidate"]["total"] for b in body["buckets"]) == 4
    assert sum(b["incumbent"]["total"] for b in body["buckets"]) == 1
    if by == "week":
        assert all(b["bucket"].startswith("2026-W") for b in body["buckets"])


def test_compare_with_kind_and_window(client: TestClient, api_engine: Engine) -> None:
    since, until = T0, T0 + timedelta(days=2)
    params = {"by": "day", "kind": "crash", "since": since.isoformat(), "until": until.isoformat()}
    body = client.get(f"{URL}/compare", params=params, headers=READ).json()
    expected = compare_incidents(api_engine, DEP, by="day", kind="crash", since=since, until=until)
    assert body == as_json(IncidentComparison.model_validate(finite(expected)))
    assert body["kinds"] == ["crash"]
    assert body["roles"]["candidate"]["count"] == 2


@pytest.mark.parametrize(
    "params",
    [{"kind": "meltdown"}, {"engine_role": "judge"}, {"since": "2026-13-01"}, {"by": "month"}],
)
def test_bad_filters_are_422(client: TestClient, params: dict[str, str]) -> None:
    path = f"{URL}/compare" if "by" in params else URL
    r = client.get(path, params=params, headers=READ)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert next(iter(params)) in r.json()["detail"]


def test_naive_times_are_utc(client: TestClient) -> None:
    naive = client.get(URL, params={"since": "2026-11-03T00:00:00"}, headers=READ).json()
    aware = client.get(URL, params={"since": "2026-11-03T00:00:00Z"}, headers=READ).json()
    assert naive["items"] == aware["items"]
    assert [i["kind"] for i in aware["items"]] == ["crash", "leak", "hang"]
