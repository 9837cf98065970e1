"""Real vLLM (CPU build) behind the mirror: the client gets exactly what vLLM answers directly
(streams compared as :func:`engine_helpers.stream_shape`: where vLLM cuts the text into chunks
depends on timing)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from engine_helpers import same_answer, vllm_metric, wait_idle
from sqlalchemy import text

from shadow_ab.dev.engines.vllm_cpu import RunningVllm
from shadow_ab.dev.processes import RunningMirror, running_mirror, running_sim
from storage.db import make_engine

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1200)]


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    with client.stream("POST", url, json=body) as resp:
        raw = resp.read()
    return resp.status_code, dict(resp.headers), raw


@pytest.fixture(scope="module")
def mirror(vllm_bf16: RunningVllm) -> Iterator[RunningMirror]:
    """The mirror with real vLLM as the incumbent and a quick simulator as the candidate."""
    quick = {"latency": {"decode_ms": 2.0, "prefill_base_ms": 2.0, "prefill_per_token_ms": 0.0}}
    with (
        running_sim("vllm", "clean", overrides=quick, ledger=False) as candidate,
        running_mirror(
            vllm_bf16.base_url,
            candidate.base_url,
            deployment="real-vllm-test",
            incumbent={"flavor": "vllm"},
            candidate={"flavor": "vllm"},
        ) as running,
    ):
        yield running


def incumbent_row(database_url: str, pair_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The incumbent's record of a pair, once the sink has written it (SQLite)."""
    engine = make_engine(database_url)
    query = text("SELECT * FROM exchanges WHERE pair_id = :p AND role = 'incumbent'")
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                row = conn.execute(query, {"p": pair_id.replace("-", "")}).first()
            if row is not None or time.monotonic() > deadline:
                assert row is not None, f"no incumbent record of {pair_id}"
                return dict(row._mapping)
            time.sleep(0.2)
    finally:
        engine.dispose()


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me about the river and the bridge"}],
        "max_tokens": 16,
        "temperature": 0,
        **extra,
    }


def completion(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-llama",
        "prompt": "The river",
        "max_tokens": 16,
        "temperature": 0,
        **extra,
    }


def path(body: dict[str, Any]) -> str:
    return "/completions" if "prompt" in body else "/chat/completions"


USAGE = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(**USAGE),
        completion(),
        completion(**USAGE),
        chat(logprobs=True, top_logprobs=3),
        chat(n=2, temperature=1.0, seed=7),
        completion(stop=[" the", "."], **USAGE),
        completion(logprobs=2, echo=False),
    ],
    ids=[
        "chat",
        "chat-stream-usage",
        "cmpl",
        "cmpl-stream-usage",
        "chat-logprobs",
        "chat-n2-seeded",
        "cmpl-stop-stream-usage",
        "cmpl-logprobs",
    ],
)
def test_the_mirror_answers_real_vllms_bytes(
    mirror: RunningMirror, vllm_bf16: RunningVllm, body: dict[str, Any]
) -> None:
    with httpx.Client(timeout=120.0) as client:
        s1, h1, b1 = post(client, mirror.v1 + path(body), body)
        s2, h2, b2 = post(client, vllm_bf16.v1 + path(body), body)
    assert (s1, s2) == (200, 200), b1[:500]
    same_answer(b1, b2, bool(body.get("stream")))
    assert h1["content-type"] == h2["content-type"]
    assert b'"system_fingerprint":"vllm-' in b1
    assert "x-shadow-pair-id" in h1


@pytest.mark.parametrize(
    "body",
    [
        chat(stream=True),
        completion(stream=True),
        chat(stream=True, n=2, temperature=1.0, seed=7),
        completion(stream=True, stream_options={"include_usage": False}),
        chat(stream=True, stream_options={"continuous_usage_stats": True}),
        completion(stream=True, stream_options={}),
    ],
    ids=["chat-stream", "cmpl-stream", "chat-n2-stream", "usage-false", "continuous", "empty"],
)
def test_a_stream_without_include_usage_keeps_the_fingerprint(
    mirror: RunningMirror, vllm_bf16: RunningVllm, body: dict[str, Any]
) -> None:
    """Real vLLM puts ``system_fingerprint`` on each choice's finish chunk; through the mirror
    it must be there too, though the mirror asks vLLM for the usage chunk (which then carries
    the fingerprint instead) and hides it."""
    with httpx.Client(timeout=120.0) as client:
        s1, _, b1 = post(client, mirror.v1 + path(body), body)
        s2, _, b2 = post(client, vllm_bf16.v1 + path(body), body)
    assert (s1, s2) == (200, 200)
    assert b'"usage":{' not in b1 and b'"usage":{' not in b2
    n = body.get("n", 1)
    assert b2.count(b'"finish_reason":"length"') == n
    assert b2.count(b'"system_fingerprint":"vllm-') == n
    assert b1.count(b'"system_fingerprint":"vllm-') == n
    same_answer(b1, b2, stream=True)


def test_the_incumbents_records_still_count_tokens_of_streams_without_usage(
    mirror: RunningMirror,
) -> None:
    """The usage chunk the mirror asks for (and hides) gives the record its token counts."""
    body = chat(stream=True)
    with httpx.Client(timeout=120.0) as client:
        status, headers, _ = post(client, mirror.v1 + path(body), body)
    assert status == 200
    assert mirror.database_url is not None
    inc = incumbent_row(mirror.database_url, headers["x-shadow-pair-id"])
    assert inc["status"] == "ok" and inc["completion_tokens"] == 16 and inc["tpot_s"] is not None
    assert inc["prompt_tokens"] and inc["prompt_tokens"] > 0
    assert '"stream_options.include_usage"' in inc["rewrites"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (chat(model="no-such-model"), 404),
        (completion(prompt="the river " * 600), 400),
        (chat(max_tokens=5000), 400),
    ],
    ids=["404-model", "400-prompt-too-long", "400-max-tokens"],
)
def test_real_vllms_errors_arrive_as_they_were(
    mirror: RunningMirror, vllm_bf16: RunningVllm, body: dict[str, Any], status: int
) -> None:
    with httpx.Client(timeout=120.0) as client:
        s1, h1, b1 = post(client, mirror.v1 + path(body), body)
        s2, h2, b2 = post(client, vllm_bf16.v1 + path(body), body)
    assert (s1, s2) == (status, status), b2[:300]
    assert b1 == b2
    assert h1["content-type"] == h2["content-type"]


def test_a_client_that_drops_a_stream_stops_real_vllms_generation(
    mirror: RunningMirror, vllm_bf16: RunningVllm
) -> None:
    """A client leaves a long stream after its first chunks: the mirror records the incumbent's
    answer as cancelled and closes its request, and real vLLM stops generating: the request
    leaves its running count having generated far fewer tokens than ``max_tokens`` asks, and
    does not finish by length. (vLLM 0.32 does not count a request its client left in
    ``vllm:request_success_total{finished_reason="abort"}``: that is for aborts by the engine.)"""
    base = vllm_bf16.base_url
    wait_idle(base)
    max_tokens = 1000  # a minute or more of the tiny model on CPU: leaving early is visible

    def counts() -> tuple[float, float]:
        """The counters once they hold still for a second: vLLM can count a request finished
        a moment after its running gauge went to 0 (an earlier test's request)."""
        now = None
        while True:
            then, now = (
                now,
                (
                    vllm_metric(base, "vllm:request_success_total"),
                    vllm_metric(base, "vllm:generation_tokens_total"),
                ),
            )
            if now == then:
                return now
            time.sleep(1.0)

    finished, generated = counts()
    body = completion(stream=True, max_tokens=max_tokens, prompt="The river")
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", mirror.v1 + "/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        pair_id = resp.headers["x-shadow-pair-id"]
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: {")
            if events == 3:
                break  # leaving the block closes the connection
    wait_idle(base)
    finished2, generated2 = counts()
    assert finished2 == finished, "the request the client left was finished, not aborted"
    assert 3 <= generated2 - generated < max_tokens, generated2 - generated
    assert mirror.database_url is not None
    inc = incumbent_row(mirror.database_url, pair_id)
    assert inc["status"] == "cancelled" and inc["error"] == "the client disconnected"
