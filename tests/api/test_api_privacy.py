"""What a `read` token must not see and what every read of content leaves behind (issue 14,
finding 10): nested request fields (``metadata.api_key``, a ``user`` e-mail) and the ``error``
column (engines echo the input there) are redacted without the ``content`` scope, and each
answer that shows prompts or outputs writes one structured audit line."""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import pytest
from api_seed import CONTENT_TOKEN, READ_TOKEN, TOKENS, bearer
from factories import exchange
from fastapi.testclient import TestClient

from api import audit
from api.app import create_app
from api.auth import Principal, TokenAuth
from api.db import make_readonly_engine
from api.settings import Scope, parse_token_map
from storage.db import make_engine
from storage.write import write_exchanges

DEP = "dep-private"
PAIR = uuid.UUID(int=14_000)
T = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
REQUEST = {
    "model": "m",
    "temperature": 0,
    "messages": [{"role": "user", "content": "my diagnosis is private"}],
    "user": "patient@example.com",
    "metadata": {"api_key": "sk-nested-secret-0001", "contact": "call +1 415 555 2671"},
}
ERROR = (
    '{"object":"error","message":"This model\'s maximum context length is 8 tokens; your'
    ' prompt \'my diagnosis is private\' is longer","type":"BadRequestError","param":null,'
    '"code":400}'
)


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    writer = make_engine(sqlite_url)
    write_exchanges(
        writer,
        [
            exchange(
                deployment=DEP,
                pair_id=PAIR,
                role="incumbent",
                sent_at=T,
                request=REQUEST,
                output_text="the answer",
            ),
            exchange(
                deployment=DEP,
                pair_id=PAIR,
                role="replay",
                sent_at=T,
                request=REQUEST,
                output_text="another answer",
            ),
            exchange(
                deployment=DEP,
                pair_id=PAIR,
                role="candidate",
                sent_at=T,
                request=REQUEST,
                status="http_error",
                http_status=400,
                error=ERROR,
            ),
        ],
    )
    writer.dispose()
    engine = make_readonly_engine(sqlite_url)
    try:
        yield TestClient(create_app(engine, TokenAuth(parse_token_map(TOKENS, "t"))))
    finally:
        engine.dispose()


def test_read_token_sees_no_nested_secret_or_echoed_input(client: TestClient) -> None:
    got = client.get(f"/v1/deployments/{DEP}/pairs/{PAIR}", headers=bearer(READ_TOKEN))
    assert got.status_code == 200
    body = got.json()
    for private in ("sk-nested-secret-0001", "patient@example.com", "415 555", "diagnosis"):
        assert private not in got.text, private
    assert body["prompt"] is None
    assert body["parameters"]["user"] == "[EMAIL]"
    assert body["parameters"]["metadata"] == {"contact": "call [PHONE]"}
    assert body["parameters"]["temperature"] == 0  # parameters stay readable
    error = body["sides"]["candidate"]["error"]
    assert error.startswith("type=BadRequestError code=400 [message not kept")


def test_content_token_sees_text_but_never_a_credential(client: TestClient) -> None:
    got = client.get(f"/v1/deployments/{DEP}/pairs/{PAIR}", headers=bearer(CONTENT_TOKEN))
    body = got.json()
    assert "sk-nested-secret-0001" not in got.text
    assert body["parameters"]["user"] == "patient@example.com"
    assert body["parameters"]["metadata"] == {"contact": "call +1 415 555 2671"}
    assert body["sides"]["candidate"]["error"] == ERROR
    assert body["prompt"] == REQUEST["messages"]


def test_every_read_of_content_is_audited(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="shadow_ab.audit"):
        client.get(f"/v1/deployments/{DEP}/pairs/{PAIR}", headers=bearer(READ_TOKEN))
        client.get(f"/v1/deployments/{DEP}/pairs/{PAIR}", headers=bearer(CONTENT_TOKEN))
        html = client.get(
            f"/v1/deployments/{DEP}/pairs/{PAIR}?format=html", headers=bearer(CONTENT_TOKEN)
        )
    assert html.status_code == 200
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "shadow_ab.audit"]
    assert len(lines) == 2  # the read token saw no content: nothing to audit
    for line in lines:
        assert line["event"] == "content_read"
        assert line["route"] == f"/v1/deployments/{DEP}/pairs/{PAIR}"
        assert line["deployment"] == DEP and line["pair_ids"] == [str(PAIR)]
        assert len(line["token"]) == 12 and line["token"] not in CONTENT_TOKEN
        assert datetime.fromisoformat(line["time"]).tzinfo is not None
    assert CONTENT_TOKEN not in caplog.text


def test_a_page_of_divergent_pairs_is_audited_with_its_range(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"/v1/deployments/{DEP}/pairs/divergent"
    params = {"against": "replay", "since": "2026-11-20T00:00:00Z"}
    with caplog.at_level(logging.INFO, logger="shadow_ab.audit"):
        seen = client.get(url, params=params, headers=bearer(READ_TOKEN)).json()
        page = client.get(url, params=params, headers=bearer(CONTENT_TOKEN)).json()
    assert [p["pair_id"] for p in seen["items"]] == [str(PAIR)]
    assert seen["items"][0]["other"]["output_text"] is None
    assert page["items"][0]["other"]["output_text"] == "another answer"
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "shadow_ab.audit"]
    assert len(lines) == 1
    assert lines[0]["route"] == url and lines[0]["pair_ids"] == [str(PAIR)]
    assert lines[0]["since"] == "2026-11-20T00:00:00+00:00" and lines[0]["until"] is None


def test_audit_lines_go_to_their_own_stream() -> None:
    stream = io.StringIO()
    saved = list(audit.log.handlers), audit.log.propagate, audit.log.level
    audit.log.handlers.clear()
    try:
        audit.configure(stream)
        audit.content_read(
            Principal(frozenset({Scope.READ, Scope.CONTENT}), token_id="abc123def456"),
            "/v1/deployments/d/pairs/divergent",
            "d",
            pair_ids=[PAIR],
            since=T,
        )
    finally:
        audit.log.handlers[:] = saved[0]
        audit.log.propagate, audit.log.level = saved[1], saved[2]
    line = orjson.loads(stream.getvalue())
    assert line["token"] == "abc123def456" and line["since"] == T.isoformat()
    assert line["pair_ids"] == [str(PAIR)] and line["report_id"] is None
