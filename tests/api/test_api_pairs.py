"""Divergent pairs (keyset pages) and one pair side by side (divergence offsets, HTML)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from api_seed import (
    CANDIDATE_TEXT,
    CONTENT_TOKEN,
    DEP,
    INCUMBENT_TEXT,
    READ_TOKEN,
    REPLAY_TEXT,
    SIDE_BY_SIDE_PAIR,
    T0,
    TOKENS,
    bearer,
    expected_divergent,
)
from factories import exchange
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from api.app import create_app
from api.auth import TokenAuth
from api.db import make_readonly_engine
from api.divergence import highlight
from api.settings import parse_token_map
from shadow_ab.records import ExchangeRecord
from storage.db import make_engine
from storage.models import Deployment
from storage.write import write_exchanges

DIVERGENT = f"/v1/deployments/{DEP}/pairs/divergent"
CONTENT = bearer(CONTENT_TOKEN)


def all_pages(client: TestClient, url: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        page = client.get(url, params=query, headers=CONTENT)
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["items"]) <= body["limit"]
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("paging did not end")


@pytest.mark.parametrize("limit", [1, 4, 7, 500])
def test_pages_cover_every_divergent_pair_once_in_keyset_order(
    client: TestClient, limit: int
) -> None:
    items = all_pages(client, DIVERGENT, limit=limit)
    assert [uuid.UUID(i["pair_id"]) for i in items] == expected_divergent("candidate")
    keys = [(i["sent_at"], i["pair_id"]) for i in items]
    assert len(set(keys)) == len(keys)


def test_replay_pages_are_the_noise_floor_pairs(client: TestClient) -> None:
    items = all_pages(client, DIVERGENT, limit=3, against="replay")
    assert [uuid.UUID(i["pair_id"]) for i in items] == expected_divergent("replay")
    assert all(i["other"]["role"] == "replay" for i in items)


def test_each_item_carries_the_evaluator_divergence(client: TestClient) -> None:
    items = all_pages(client, DIVERGENT, limit=50)
    by_id = {i["pair_id"]: i for i in items}
    side = by_id[str(SIDE_BY_SIDE_PAIR)]
    d = side["divergence"]
    assert d["diverged"] is True and d["exact_match"] is False
    assert d["token_basis"] == "logprobs"
    assert d["first_divergence"] == 0
    assert d["near_tie"] is True  # 42/43 are in each other's top-k
    assert d["first_divergence_char"] == INCUMBENT_TEXT.index("42") + 1
    finish_only = [i for i in items if i["divergence"]["exact_match"]]
    assert finish_only, "pairs with equal text but another finish reason are listed too"
    assert all(i["divergence"]["finish_mismatch"] for i in finish_only)


def test_since_until_bound_the_pages(client: TestClient) -> None:
    since, until = T0 + timedelta(hours=10), T0 + timedelta(hours=30)
    items = all_pages(client, DIVERGENT, limit=2, since=since.isoformat(), until=until.isoformat())
    assert items
    assert all(since.isoformat() <= i["sent_at"].replace("Z", "+00:00") for i in items)
    full = all_pages(client, DIVERGENT, limit=500)
    inside = [i for i in full if since <= _ts(i["sent_at"]) < until]
    assert [i["pair_id"] for i in items] == [i["pair_id"] for i in inside]


def _ts(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"cursor": "not-a-cursor"}, "not a cursor this API issued"),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"against": "judge"}, "against"),
        ({"since": "2026-11-03T00:00:00Z", "until": "2026-11-02T00:00:00Z"}, "before until"),
        ({"since": "yesterday"}, "since"),
    ],
)
def test_bad_parameters_are_422_problems(
    client: TestClient, params: dict[str, Any], needle: str
) -> None:
    r = client.get(DIVERGENT, params=params, headers=CONTENT)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert needle in r.json()["detail"]


def test_unknown_deployment_and_pair_are_404_naming_them(client: TestClient) -> None:
    r = client.get("/v1/deployments/no-such-dep/pairs/divergent", headers=CONTENT)
    assert r.status_code == 404
    assert "'no-such-dep'" in r.json()["detail"]
    missing = uuid.UUID(int=123456789)
    r = client.get(f"/v1/deployments/{DEP}/pairs/{missing}", headers=CONTENT)
    assert r.status_code == 404
    assert str(missing) in r.json()["detail"]
    r = client.get(f"/v1/deployments/{DEP}/pairs/not-a-uuid", headers=CONTENT)
    assert r.status_code == 422


def test_side_by_side_json_has_both_sides_timings_rewrites_and_offsets(
    client: TestClient,
) -> None:
    r = client.get(f"/v1/deployments/{DEP}/pairs/{SIDE_BY_SIDE_PAIR}", headers=CONTENT)
    assert r.status_code == 200
    pair = r.json()
    assert set(pair["sides"]) == {"incumbent", "candidate", "replay"}
    inc, cand = pair["sides"]["incumbent"], pair["sides"]["candidate"]
    assert (inc["ttft_s"], inc["e2e_s"], inc["itl_s"]) == (0.05, 0.3, [0.01])
    assert cand["rewrites"] == ["drop:logit_bias"]
    assert cand["output_text"] == CANDIDATE_TEXT
    at = INCUMBENT_TEXT.index("42") + 1  # "4" agrees, "2" vs "3" differs
    mark = pair["divergence"]["candidate"]["highlight"]
    assert mark == {
        "incumbent": {"start": at, "end": at + 1},
        "other": {"start": at, "end": at + 1},
    }
    assert INCUMBENT_TEXT[at : at + 1] == "2" and CANDIDATE_TEXT[at : at + 1] == "3"
    replay = pair["divergence"]["replay"]
    comma = INCUMBENT_TEXT.index(".")
    assert replay["first_divergence_char"] == comma
    assert REPLAY_TEXT[: replay["highlight"]["other"]["start"]] == INCUMBENT_TEXT[:comma]


def test_side_by_side_html_marks_the_divergence(client: TestClient) -> None:
    url = f"/v1/deployments/{DEP}/pairs/{SIDE_BY_SIDE_PAIR}"
    for kwargs in ({"params": {"format": "html"}}, {"headers": {"Accept": "text/html"}}):
        headers = {**CONTENT, **kwargs.get("headers", {})}
        r = client.get(url, params=kwargs.get("params"), headers=headers)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        at = INCUMBENT_TEXT.index("42") + 1
        assert f'The answer is 4<mark data-first-divergence="{at}">2</mark>' in r.text
        assert f'4<mark class="other" data-first-divergence="{at}">3</mark>' in r.text
        assert "drop:logit_bias" in r.text


def test_html_escapes_stored_text(pg_url: str) -> None:
    evil = "<script>alert(1)</script>"
    pid = uuid.uuid4()
    rows = [
        exchange(
            deployment="dep-x",
            pair_id=pid,
            role=role,
            engine=f"e@{role}",
            endpoint="completions",
            stream=False,
            sent_at=T0,
            request={"prompt": evil, "temperature": 0},
            output_text=text,
        )
        for role, text in (("incumbent", f"ok {evil}"), ("candidate", f"no {evil}"))
    ]
    writer = make_engine(pg_url)
    write_exchanges(writer, rows)
    writer.dispose()
    engine = make_readonly_engine(pg_url)
    try:
        app = create_app(engine, TokenAuth(parse_token_map(TOKENS, "t")))
        with TestClient(app) as c:
            r = c.get(f"/v1/deployments/dep-x/pairs/{pid}?format=html", headers=CONTENT)
    finally:
        engine.dispose()
    assert r.status_code == 200
    assert "<script>" not in r.text
    assert "&lt;script&gt;" in r.text


def _pair(i: int, when: Any, differ: bool) -> list[ExchangeRecord]:
    pid = uuid.UUID(int=10_000 + i)
    return [
        exchange(
            deployment="dep-p",
            pair_id=pid,
            role=role,
            engine=f"e@{role}",
            sent_at=when,
            request={"temperature": 0},
            output_text="x" if role == "incumbent" or not differ else "y",
        )
        for role in ("incumbent", "candidate")
    ]


def test_pages_stay_stable_when_pairs_arrive_meanwhile(pg_url: str) -> None:
    writer: Engine = make_engine(pg_url)
    write_exchanges(
        writer, [r for i in range(10) for r in _pair(i, T0 + timedelta(minutes=i), True)]
    )
    engine = make_readonly_engine(pg_url)
    url = "/v1/deployments/dep-p/pairs/divergent"
    try:
        app = create_app(engine, TokenAuth(parse_token_map(TOKENS, "t")))
        with TestClient(app) as c:
            first = c.get(url, params={"limit": 4}, headers=bearer(READ_TOKEN)).json()
            # New pairs before and after the cursor, and an equal pair, arrive between pages.
            write_exchanges(
                writer,
                _pair(100, T0 - timedelta(hours=1), True)
                + _pair(101, T0 + timedelta(hours=1), True)
                + _pair(102, T0 + timedelta(minutes=30), False),
            )
            rest = all_pages_with(c, url, first["next_cursor"])
    finally:
        engine.dispose()
        writer.dispose()
    seen = [p["pair_id"] for p in first["items"]] + [p["pair_id"] for p in rest]
    expected = [str(uuid.UUID(int=10_000 + i)) for i in [*range(10), 101]]
    assert seen == expected  # nothing repeated or skipped; the earlier newcomer is behind us


def all_pages_with(
    c: TestClient, url: str, cursor: str | None, first: bool = False
) -> list[dict[str, Any]]:
    """Every item from ``cursor`` on (from the first page when ``first``), 4 a page."""
    items: list[dict[str, Any]] = []
    while cursor or first:
        params: dict[str, Any] = {"limit": 4, **({"cursor": cursor} if cursor else {})}
        body = c.get(url, params=params, headers=bearer(READ_TOKEN)).json()
        items.extend(body["items"])
        cursor, first = body["next_cursor"], False
    return items


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("abc", "abc", None),
        ("abXc", "abYc", ((2, 3), (2, 3))),
        ("aa", "aaa", ((2, 2), (2, 3))),  # suffix may not overlap the prefix
        ("", "new", ((0, 0), (0, 3))),
        ("héllo wörld", "héllo world", ((7, 8), (7, 8))),
    ],
)
def test_highlight_offsets(
    a: str, b: str, expected: tuple[tuple[int, int], tuple[int, int]] | None
) -> None:
    mark = highlight(a, b)
    if expected is None:
        assert mark is None
        return
    assert mark is not None
    assert ((mark.incumbent.start, mark.incumbent.end), (mark.other.start, mark.other.end)) == (
        expected
    )
    assert a[: mark.incumbent.start] == b[: mark.other.start]
    assert a[mark.incumbent.end :] == b[mark.other.end :]


def _client_on(url: str) -> tuple[TestClient, Engine]:
    engine = make_readonly_engine(url)
    return TestClient(create_app(engine, TokenAuth(parse_token_map(TOKENS, "t")))), engine


def test_sparse_divergence_resumes_after_a_bounded_scan(pg_url: str) -> None:
    # Divergent pairs 4 days apart, agreeing pairs between: one request reads at most
    # MAX_SCAN of time, answers with what it found and a cursor to continue from.
    records = _pair(0, T0, True) + _pair(1, T0 + timedelta(days=4), True)
    records += [r for d in range(1, 4) for r in _pair(10 + d, T0 + timedelta(days=d), False)]
    writer = make_engine(pg_url)
    write_exchanges(writer, records)
    writer.dispose()
    c, engine = _client_on(pg_url)
    url = "/v1/deployments/dep-p/pairs/divergent"
    try:
        first = c.get(url, params={"limit": 10}, headers=CONTENT).json()
        rest = all_pages_with(c, url, first["next_cursor"])
    finally:
        engine.dispose()
    assert [p["pair_id"] for p in first["items"]] == [str(uuid.UUID(int=10_000))]
    assert first["next_cursor"] is not None
    assert [p["pair_id"] for p in rest] == [str(uuid.UUID(int=10_001))]


def test_pairs_on_a_sqlite_store(sqlite_url: str) -> None:
    writer = make_engine(sqlite_url)
    write_exchanges(
        writer, [r for i in range(6) for r in _pair(i, T0 + timedelta(minutes=i), i % 2 == 0)]
    )
    writer.dispose()
    c, engine = _client_on(sqlite_url)
    try:
        items = all_pages_with(c, "/v1/deployments/dep-p/pairs/divergent", None, first=True)
        one = c.get(f"/v1/deployments/dep-p/pairs/{uuid.UUID(int=10_002)}", headers=CONTENT)
    finally:
        engine.dispose()
    assert [p["pair_id"] for p in items] == [str(uuid.UUID(int=10_000 + i)) for i in (0, 2, 4)]
    assert one.status_code == 200
    assert one.json()["divergence"]["candidate"]["highlight"]["other"] == {"start": 0, "end": 1}


def test_the_pair_view_shows_the_margin_judged_by_the_deployment_policy(sqlite_url: str) -> None:
    """The logprob margin at the first divergence and whether it is a near tie, in JSON (the
    list and the pair) and on the HTML page; the near-tie margin is the deployment's stored
    policy's ``near_tie_nats`` (0.5 when it has none)."""
    pid = uuid.UUID(int=20_000)
    lps = {
        "incumbent": [{"token": "42", "logprob": -0.1, "top": {"42": -0.1, "43": -0.2}}],
        "candidate": [{"token": "43", "logprob": -0.1, "top": {"43": -0.1, "42": -0.3}}],
    }
    writer = make_engine(sqlite_url)
    write_exchanges(
        writer,
        [
            exchange(
                deployment="dep-m",
                pair_id=pid,
                role=role,
                engine=f"e@{role}",
                sent_at=T0,
                request={"temperature": 0},
                output_text="The answer is 4" + ("2" if role == "incumbent" else "3"),
                logprobs=lps[role],
            )
            for role in ("incumbent", "candidate")
        ],
    )
    c, engine = _client_on(sqlite_url)

    def views() -> tuple[dict[str, Any], dict[str, Any], str]:
        url = f"/v1/deployments/dep-m/pairs/{pid}"
        listed = c.get("/v1/deployments/dep-m/pairs/divergent", headers=CONTENT).json()
        one = c.get(url, headers=CONTENT).json()["divergence"]["candidate"]
        page = c.get(url, params={"format": "html"}, headers=CONTENT).text
        return listed["items"][0]["divergence"], one, page

    try:
        listed, one, page = views()
        # The larger of the sides' margins: the candidate found 43 0.2 nats likelier than 42.
        for d in (listed, one):
            assert d["margin"] == pytest.approx(0.2) and d["margin_bound"] is False
            assert d["near_tie"] is True and d["near_tie_nats"] == 0.5
        assert "logprob margin at the first divergence 0.2 nats: a near tie (within 0.5" in page
        with writer.begin() as conn:
            conn.execute(
                update(Deployment)
                .where(Deployment.name == "dep-m")
                .values(policy={"near_tie_nats": 0.1})
            )
        listed, one, page = views()
        for d in (listed, one):
            assert d["margin"] == pytest.approx(0.2)
            assert d["near_tie"] is False and d["near_tie_nats"] == 0.1
        assert "0.2 nats: a clear choice differs (hard: above 0.1 nats)" in page
    finally:
        engine.dispose()
        writer.dispose()
