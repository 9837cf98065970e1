"""The client's path through a real ``shadow-ab mirror`` process: the official openai client
with only ``base_url`` changed, byte-for-byte answers, the incumbent's errors, bad input,
pass-through, records in the store (SQLite) without credentials, and client disconnects."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from mirror_helpers import (
    MODEL,
    StandInEngine,
    normalize,
    pair_key,
    post,
    rows,
    wait_rows,
)

from shadow_ab.dev.processes import RunningMirror, RunningSim, free_port, http_get, running_mirror


@pytest.fixture(scope="module")
def served(
    engines: tuple[RunningSim, RunningSim],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[RunningMirror]:
    """The mirror as a subprocess (its client path is mirror/server.py)."""
    inc, cand = engines
    db = tmp_path_factory.mktemp("mirror-serving") / "records.db"
    with running_mirror(
        inc.base_url,
        cand.base_url,
        database_url=f"sqlite:///{db}",
        deployment="serving-test",
        max_body_bytes=64 * 1024,
        health={"interval_s": 0.5},
    ) as mirror:
        yield mirror


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as client:
        yield client


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
        "seed": 3,
        **extra,
    }


def completion(prompt: str = "once upon", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "temperature": 0, **extra}


# -- the openai client ------------------------------------------------------------------------


def test_openai_client_chat_and_completions(
    served: RunningMirror, engines: tuple[RunningSim, RunningSim]
) -> None:
    via = openai.OpenAI(base_url=served.v1, api_key="sk-test", max_retries=0)
    direct = openai.OpenAI(base_url=engines[0].v1, api_key="sk-test", max_retries=0)
    msgs: Any = [{"role": "user", "content": "tell me"}]

    raw = via.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=10, temperature=0
    )
    assert raw.headers["x-shadow-pair-id"]
    got = raw.parse()
    want = direct.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage == want.usage

    def streamed(client: openai.OpenAI, **kw: Any) -> tuple[str, list[Any]]:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=10, temperature=0, stream=True, **kw
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, [c.usage for c in chunks if c.usage is not None]

    text, usages = streamed(via)
    assert (text, usages) == streamed(direct)
    assert usages == []  # the usage chunk the mirror asked for is not shown
    text_u, usages_u = streamed(via, stream_options={"include_usage": True})
    assert (
        text_u == text and usages_u == streamed(direct, stream_options={"include_usage": True})[1]
    )
    assert len(usages_u) == 1

    c_got = via.completions.create(model=MODEL, prompt="abc", temperature=0)
    c_want = direct.completions.create(model=MODEL, prompt="abc", temperature=0)
    assert c_got.choices[0].text == c_want.choices[0].text
    assert c_got.usage is not None and c_got.usage.completion_tokens == 16  # vLLM's default
    pieces = via.completions.create(model=MODEL, prompt="abc", temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in pieces if p.choices) == c_want.choices[0].text


def test_openai_client_sees_the_incumbents_errors(
    served: RunningMirror, engines: tuple[RunningSim, RunningSim]
) -> None:
    via = openai.OpenAI(base_url=served.v1, api_key="x", max_retries=0)
    direct = openai.OpenAI(base_url=engines[0].v1, api_key="x", max_retries=0)
    msgs: Any = [{"role": "user", "content": "hi"}]
    for kw, exc_type in (
        ({"model": "no-such-model"}, openai.NotFoundError),
        ({"model": MODEL, "top_logprobs": 3}, openai.BadRequestError),  # without logprobs
    ):
        errors = []
        for client in (via, direct):
            with pytest.raises(exc_type) as info:
                client.chat.completions.create(messages=msgs, max_tokens=4, **kw)
            errors.append(info.value)
        assert errors[0].status_code == errors[1].status_code
        assert errors[0].body == errors[1].body
        assert errors[0].response.headers["x-shadow-pair-id"]


# -- bytes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(stream=True),
        chat(stream=True, stream_options={"include_usage": True}),
        chat(stream=True, logprobs=True, top_logprobs=2),
        completion(),
        completion(stream=True, max_tokens=5, logprobs=2),
        chat(max_tokens=1_000_000),  # the incumbent's 400 (context length)
    ],
    ids=["chat", "chat-stream", "chat-usage", "chat-logprobs", "cmpl", "cmpl-stream", "chat-400"],
)
def test_answers_are_the_incumbents_bytes(
    served: RunningMirror,
    engines: tuple[RunningSim, RunningSim],
    http: httpx.Client,
    body: dict[str, Any],
) -> None:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    s1, h1, b1, _ = post(http, served.base_url + path, body)
    s2, h2, b2, _ = post(http, engines[0].base_url + path, body)
    assert s1 == s2
    assert normalize(b1) == normalize(b2)
    assert h1["content-type"] == h2["content-type"]
    # Neither the mirror's Server header nor the engine's (its name and version stay behind
    # the mirror: HIDDEN_RESPONSE_HEADERS, mirror/headers.py); the Date is the incumbent's.
    assert "server" in h2 and "server" not in h1
    assert "date" in h1
    assert "x-shadow-pair-id" in h1
    if body.get("stream") and not body.get("stream_options"):
        assert b'"usage":{' not in b1


def finish_events(raw: bytes) -> list[bytes]:
    """The events of a stream that end a choice, normalized, their text blanked (where a
    stream is cut into chunks depends on timing; these are about the members)."""
    return [
        _TEXT.sub(rb'"\1":"~"', normalize(e))
        for e in raw.split(b"\n\n")
        if b'"finish_reason":"' in e
    ]


_TEXT = re.compile(rb'"(content|text)":"((?:[^"\\]|\\.)*)"')


@pytest.mark.parametrize(
    "body",
    [
        chat(stream=True),
        completion(stream=True, max_tokens=5),
        chat(stream=True, n=2, temperature=1.0),
        chat(stream=True, stream_options={"include_usage": False}),
        chat(stream=True, stream_options={"continuous_usage_stats": True}),
        completion(stream=True, max_tokens=5, stream_options={}),
    ],
    ids=["chat", "cmpl", "chat-n2", "usage-false", "continuous", "empty-options"],
)
def test_streams_keep_the_fingerprint_on_their_finish_chunks(
    served: RunningMirror,
    engines: tuple[RunningSim, RunningSim],
    http: httpx.Client,
    body: dict[str, Any],
) -> None:
    """vLLM (0.32) stamps system_fingerprint on each choice's finish chunk, unless a usage chunk
    follows: then only there. The mirror asks for that chunk and hides it; the client's finish
    chunks must still carry the fingerprint (issue 13, seen on real vLLM)."""
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    _, _, via, _ = post(http, served.base_url + path, body)
    _, _, direct, _ = post(http, engines[0].base_url + path, body)
    n = body.get("n", 1)
    assert via.count(b'"system_fingerprint":"vllm-') == n
    assert finish_events(via) == finish_events(direct)
    assert len(finish_events(direct)) == n
    assert via.count(b'"usage":') == direct.count(b'"usage":')


def test_malformed_json_goes_to_the_incumbent_unshadowed(
    served: RunningMirror, engines: tuple[RunningSim, RunningSim], http: httpx.Client
) -> None:
    before = served.metric("shadow_ab_mirror_shadow_decisions_total", decision="skipped_malformed")
    bad = b'{"model": "x", "messages": ['
    s1, h1, b1, _ = post(http, served.base_url + "/v1/chat/completions", bad)
    s2, _, b2, _ = post(http, engines[0].base_url + "/v1/chat/completions", bad)
    assert (s1, b1) == (s2, b2) and s1 == 400
    after = served.metric("shadow_ab_mirror_shadow_decisions_total", decision="skipped_malformed")
    assert after == before + 1
    assert served.database_url is not None
    key = pair_key(h1["x-shadow-pair-id"], served.database_url)
    found = wait_rows(served.database_url, 1, "pair_id = :p", p=key)
    assert [(r["role"], r["status"], r["http_status"]) for r in found] == [
        ("incumbent", "http_error", 400)
    ]


def test_body_size_limit(served: RunningMirror, http: httpx.Client) -> None:
    before = served.metric("shadow_ab_mirror_shadow_decisions_total", decision="skipped_too_large")
    big = chat("x " * 40_000)
    status, _, body, _ = post(http, served.base_url + "/v1/chat/completions", big)
    assert status == 413 and b"max_body_bytes" in body
    after = served.metric("shadow_ab_mirror_shadow_decisions_total", decision="skipped_too_large")
    assert after == before + 1
    assert served.healthy()


def test_allowed_paths_pass_through(
    served: RunningMirror, engines: tuple[RunningSim, RunningSim]
) -> None:
    for path in ("/v1/models", "/version", "/health"):
        assert http_get(served.base_url + path) == http_get(engines[0].base_url + path), path
    # Anything else is the mirror's 404, the admin endpoints included (tests/mirror/test_edge.py).
    for path in ("/no-such-path", "/healthz", "/metrics"):
        assert http_get(served.base_url + path)[0] == 404, path
    status, body = http_get(served.admin_url + "/healthz")
    assert status == 200 and b'"status":"ok"' in body


# -- records ----------------------------------------------------------------------------------


def test_records_land_in_the_store_without_credentials(
    served: RunningMirror, http: httpx.Client
) -> None:
    assert served.database_url is not None
    secrets = {
        "authorization": "Bearer sk-header-secret-1",
        "cookie": "session=cookie-secret-2",
        "x-api-key": "api-key-secret-3",
    }
    _, h, _, _ = post(http, served.base_url + "/v1/chat/completions", chat(stream=True), **secrets)
    _, h2, _, _ = post(http, served.base_url + "/v1/completions", completion(), **secrets)
    key = pair_key(h["x-shadow-pair-id"], served.database_url)
    found = {r["role"]: r for r in wait_rows(served.database_url, 2, "pair_id = :p", p=key)}
    inc, cand = found["incumbent"], found["candidate"]
    for r in (inc, cand):
        assert r["status"] == "ok" and r["http_status"] == 200
        assert r["deployment"] == "serving-test" and r["endpoint"] == "chat" and r["stream"]
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["tpot_s"] is not None and 2 <= r["completion_tokens"] <= 12
        assert r["finish_reason"] in ("length", "stop")
    assert inc["engine"] == "vllm@incumbent" and cand["engine"] == "trtllm@candidate"
    assert inc["output_text"] == cand["output_text"]  # clean A/A pair, greedy
    assert inc["completion_tokens"] == cand["completion_tokens"]
    assert '"stream_options.include_usage"' in inc["rewrites"]

    key2 = pair_key(h2["x-shadow-pair-id"], served.database_url)
    found2 = {r["role"]: r for r in wait_rows(served.database_url, 2, "pair_id = :p", p=key2)}
    # max_tokens explicit, as vLLM's default; top logprobs for the near-tie margin
    assert found2["candidate"]["rewrites"] == '["max_tokens","logprobs"]'
    assert found2["incumbent"]["rewrites"] == "[]"
    assert found2["incumbent"]["ttft_s"] is None and found2["incumbent"]["e2e_s"] > 0

    dump = repr(rows(served.database_url))
    for value in secrets.values():
        assert value.split()[-1] not in dump


def test_client_disconnect_cancels_both_engines(
    served: RunningMirror, engines: tuple[RunningSim, RunningSim]
) -> None:
    assert served.database_url is not None
    long = chat("a long one", stream=True, max_tokens=3000, ignore_eos=True)
    with (
        httpx.Client(timeout=30.0) as client,
        client.stream("POST", served.base_url + "/v1/chat/completions", json=long) as resp,
    ):
        pair = resp.headers["x-shadow-pair-id"]
        next(resp.iter_raw())  # the first tokens arrived; now hang up
    # 3000 tokens take over 6 s; the engine stops as soon as the mirror hangs up too
    deadline = time.monotonic() + 4.0
    running = -1.0
    while time.monotonic() < deadline:
        running = _vllm_running(engines[0])
        if running == 0:
            break
        time.sleep(0.05)
    assert running == 0
    key = pair_key(pair, served.database_url)
    found = {r["role"]: r for r in wait_rows(served.database_url, 2, "pair_id = :p", p=key)}
    assert found["incumbent"]["status"] == "cancelled"
    assert found["candidate"]["status"] == "cancelled"
    assert found["incumbent"]["ttft_s"] is not None  # what was measured before is kept


def _vllm_running(sim: RunningSim) -> float:
    status, body = http_get(sim.base_url + "/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("vllm:num_requests_running"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- errors only a stand-in engine can give ---------------------------------------------------


class ErrorEngine(StandInEngine):
    """An HTTP server answering every POST with the status in ``x-want-status`` (the simulator
    has no 429); bodies and headers as vLLM's error responses."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, str]] = []

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        status = int(request.headers.get("x-want-status", "500"))
        body = {
            "error": {"message": f"status {status}", "type": "E", "param": None, "code": status}
        }
        headers = {"retry-after": "7"} if status == 429 else {}
        return web.json_response(body, status=status, headers=headers)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._answer)


def test_incumbent_429_and_500_arrive_as_they_were(tmp_path: Path) -> None:
    """Stand-in engines on both sides: they also show which headers each one was sent."""
    with (
        ErrorEngine() as incumbent,
        ErrorEngine() as candidate,
        running_mirror(
            f"http://127.0.0.1:{incumbent.port}",
            f"http://127.0.0.1:{candidate.port}",
            database_url=f"sqlite:///{tmp_path / 'r.db'}",
            health_enabled=False,
            candidate={"headers": {"Authorization": "Bearer candidate-key"}},
        ) as mirror,
    ):
        via = openai.OpenAI(base_url=mirror.v1, api_key="client-key", max_retries=0)
        msgs: Any = [{"role": "user", "content": "hi"}]
        pair_ids = []
        for status, exc_type in ((429, openai.RateLimitError), (500, openai.InternalServerError)):
            with pytest.raises(exc_type) as info:
                via.chat.completions.create(
                    model=MODEL,
                    messages=msgs,
                    max_tokens=4,
                    extra_headers={"x-want-status": str(status)},
                )
            assert info.value.status_code == status
            assert info.value.body == {
                "message": f"status {status}",
                "type": "E",
                "param": None,
                "code": status,
            }
            pair_ids.append(info.value.response.headers["x-shadow-pair-id"])
            if status == 429:
                assert info.value.response.headers["retry-after"] == "7"
        deadline = time.monotonic() + 10
        while len(candidate.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [h["x-shadow-pair-id"] for h in incumbent.seen] == pair_ids
    assert sorted(h["x-shadow-pair-id"] for h in candidate.seen) == sorted(pair_ids)
    assert {h["Authorization"] for h in incumbent.seen} == {"Bearer client-key"}
    assert {h["Authorization"] for h in candidate.seen} == {"Bearer candidate-key"}
    assert all("Accept-Encoding" not in h for h in candidate.seen)  # the mirror reads it plain


def test_unreachable_incumbent_is_a_502_and_recorded(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    nowhere = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with (
        running_mirror(*nowhere, database_url=db, health_enabled=False) as mirror,
        httpx.Client(timeout=30.0) as http,
    ):
        status, headers, body, _ = post(http, mirror.base_url + "/v1/chat/completions", chat())
        assert status == 502 and b"unreachable" in body
        assert mirror.stop() == 0
    key = pair_key(headers["x-shadow-pair-id"], db)
    found = {r["role"]: r for r in rows(db, "pair_id = :p", p=key)}
    assert found["incumbent"]["status"] == "connection_error"
    assert found["candidate"]["status"] == "connection_error"
    assert found["incumbent"]["http_status"] is None
