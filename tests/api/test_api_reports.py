"""Deployments and their reports: JSON, the HTML page, latest, redaction, 404s."""

from __future__ import annotations

import pytest
from api_seed import CONTENT_TOKEN, DEP, EMPTY_DEP, INCIDENTS, READ_TOKEN, REPORT_BODY, bearer
from fastapi.testclient import TestClient

READ = bearer(READ_TOKEN)
CONTENT = bearer(CONTENT_TOKEN)


def test_list_and_one_deployment(client: TestClient) -> None:
    names = [d["name"] for d in client.get("/v1/deployments", headers=READ).json()["items"]]
    assert names == [DEP, EMPTY_DEP]
    dep = client.get(f"/v1/deployments/{DEP}", headers=READ).json()
    assert (dep["incumbent_engine"], dep["candidate_version"]) == ("vllm", "1.0.0")
    assert dep["reports"] == 2
    assert dep["incidents"] == len(INCIDENTS)
    assert dep["latest_report"]["verdict"] == "NO-GO"
    empty = client.get(f"/v1/deployments/{EMPTY_DEP}", headers=READ).json()
    assert (empty["reports"], empty["latest_report"]) == (0, None)


def test_unknown_deployment_is_404_naming_it(client: TestClient) -> None:
    for path in ("", "/reports", "/reports/latest", "/reports/1", "/incidents"):
        r = client.get(f"/v1/deployments/nope-42{path}", headers=READ)
        assert r.status_code == 404, path
        assert r.headers["content-type"] == "application/problem+json"
        assert "deployment 'nope-42' not found" in r.json()["detail"]


def test_reports_newest_first_and_by_id(client: TestClient) -> None:
    listed = client.get(f"/v1/deployments/{DEP}/reports", headers=READ).json()["items"]
    assert [r["verdict"] for r in listed] == ["NO-GO", "INCONCLUSIVE"]
    assert [r["has_html"] for r in listed] == [True, False]
    old = client.get(f"/v1/deployments/{DEP}/reports/{listed[1]['id']}", headers=READ).json()
    assert old["body"] == {"verdict": "INCONCLUSIVE", "latency": {}}
    limited = client.get(f"/v1/deployments/{DEP}/reports", params={"limit": 1}, headers=READ)
    assert len(limited.json()["items"]) == 1


def test_latest_report_body_redacted_without_content(client: TestClient) -> None:
    url = f"/v1/deployments/{DEP}/reports/latest"
    full = client.get(url, headers=CONTENT).json()
    assert full["body"] == REPORT_BODY
    redacted = client.get(url, headers=READ).json()
    worst = redacted["body"]["divergence"]["worst"][0]
    assert worst["candidate_output"] is None
    assert worst["score"] == 0.9
    assert redacted["body"]["latency"] == REPORT_BODY["latency"]


def test_report_html_page(client: TestClient) -> None:
    url = f"/v1/deployments/{DEP}/reports/latest"
    page = client.get(url, params={"format": "html"}, headers=CONTENT)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<h1>NO-GO</h1>" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    browser = {**CONTENT, "Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    assert client.get(url, headers=browser).text == page.text
    # The page shows an output: a read-only token gets the redacted JSON, not the page.
    refused = client.get(url, params={"format": "html"}, headers=READ)
    assert refused.status_code == 403
    assert client.get(url, headers={**READ, "Accept": "application/json"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/reports/999999", 404, "no report 999999"),
        ("/reports/0", 422, "report_id"),
        ("/reports/abc", 422, "report_id"),
    ],
)
def test_missing_or_bad_report_ids(client: TestClient, path: str, status: int, needle: str) -> None:
    r = client.get(f"/v1/deployments/{DEP}{path}", headers=READ)
    assert r.status_code == status
    assert needle in r.json()["detail"]


def test_report_without_page_is_404_for_html(client: TestClient) -> None:
    listed = client.get(f"/v1/deployments/{DEP}/reports", headers=READ).json()["items"]
    old_id = listed[1]["id"]
    r = client.get(f"/v1/deployments/{DEP}/reports/{old_id}?format=html", headers=CONTENT)
    assert r.status_code == 404
    assert "no HTML page" in r.json()["detail"]
    r = client.get(f"/v1/deployments/{EMPTY_DEP}/reports/latest", headers=READ)
    assert r.status_code == 404
    assert "has no report yet" in r.json()["detail"]
