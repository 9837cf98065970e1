"""Request rewriting, sampling decisions and header forwarding: pure functions, plain values."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from pydantic import ValidationError

from mirror.headers import (
    PAIR_HEADER,
    client_headers,
    override_headers,
    shadow_headers,
    upstream_headers,
)
from mirror.rewrite import (
    CandidateRewrite,
    ask_top_logprobs,
    candidate_request,
    replay_request,
    stored_request,
    with_stream_usage,
    with_top_logprobs,
)
from mirror.sampling import Sampler, ShadowConfig, header_draw


def test_candidate_rewrites_are_applied_and_named_in_order() -> None:
    body = {"model": "llama", "prompt": "x", "stream": True, "top_k": 5, "user": "u1"}
    rw = CandidateRewrite(model_map={"llama": "llama-trt"}, drop_fields=["top_k", "absent"])
    out, done = candidate_request(body, chat=False, rewrite=rw)
    assert out == {
        "model": "llama-trt",
        "prompt": "x",
        "stream": True,
        "user": "u1",
        "max_tokens": 16,
        "stream_options": {"include_usage": True},
    }
    assert done == ["model", "drop:top_k", "max_tokens", "stream_options.include_usage"]
    assert body["model"] == "llama" and "top_k" in body  # the client's body is untouched


def test_candidate_without_rewrites_is_the_same_request() -> None:
    body = {"model": "m", "messages": [], "max_tokens": 5, "seed": 7, "temperature": 0}
    out, done = candidate_request(body, chat=True, rewrite=CandidateRewrite())
    assert out == body and done == []


def test_model_fallback_and_chat_max_tokens() -> None:
    rw = CandidateRewrite(model_map={"*": "cand", "x": "x-trt"}, chat_max_tokens=256)
    out, done = candidate_request({"model": "m", "messages": []}, chat=True, rewrite=rw)
    assert out["model"] == "cand" and out["max_tokens"] == 256
    assert done == ["model", "max_tokens"]
    out, _ = candidate_request({"model": "x", "messages": []}, chat=True, rewrite=rw)
    assert out["model"] == "x-trt"  # its own entry before "*"
    out, done = candidate_request(
        {"model": "cand", "messages": [], "max_completion_tokens": 9}, chat=True, rewrite=rw
    )
    assert done == [] and "max_tokens" not in out


def test_stream_usage_only_when_streaming_and_not_asked() -> None:
    assert with_stream_usage({"stream": False}) is None
    assert with_stream_usage({"stream": True, "stream_options": {"include_usage": True}}) is None
    assert with_stream_usage({"stream": True, "stream_options": "bad"}) is None
    for off in (False, None):
        assert with_stream_usage({"stream": True, "stream_options": {"include_usage": off}}) == {
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    # what the mirror could not hide from the client: usage on every event (continuous), or
    # an include_usage whose default depends on the vLLM version; the candidate's is asked
    for so in ({"include_usage": False, "continuous_usage_stats": True}, {}, {"x": 1}):
        assert with_stream_usage({"stream": True, "stream_options": so}) is None
        assert with_stream_usage({"stream": True, "stream_options": so}, hideable=False) == {
            "stream": True,
            "stream_options": {**so, "include_usage": True},
        }


def test_stored_request_drops_credentials_but_keeps_user() -> None:
    body = {"model": "m", "api_key": "sk-1", "Authorization": "Bearer x", "user": "alice"}
    assert stored_request(body) == {"model": "m", "user": "alice"}
    clean = {"model": "m"}
    assert stored_request(clean) is clean


def test_header_sampling_is_consistent_and_near_the_rate() -> None:
    sampler = Sampler(ShadowConfig(rate=0.3, header="X-Session-Id"))
    assert sampler.header == b"x-session-id"
    ins = [sampler.sampled(sampler.draw(f"s{i}".encode())) for i in range(4000)]
    again = [sampler.sampled(sampler.draw(f"s{i}".encode())) for i in range(4000)]
    assert ins == again
    assert 0.26 < sum(ins) / len(ins) < 0.34
    assert 0.0 <= header_draw(b"") < 1.0


def test_random_sampling_and_replay_use_the_injected_source() -> None:
    values = itertools.cycle([0.05, 0.5, 0.95])
    sampler = Sampler(ShadowConfig(rate=0.5, replay_rate=0.1), rng=lambda: next(values))
    decisions = [sampler.sampled(sampler.draw(None)) for _ in range(6)]
    assert decisions == [True, False, False, True, False, False]
    assert sampler.guard_draw(0.25) == pytest.approx(0.5)
    replays = Counter(sampler.replay() for _ in range(6))
    assert replays[True] == 2  # 0.05 < 0.1 twice in six draws
    assert Sampler(ShadowConfig(rate=0.0)).guard_draw(0.0) == 1.0
    assert not Sampler(ShadowConfig(replay_rate=0.0)).replay()


def test_shadow_config_refuses_a_header_that_is_not_one() -> None:
    with pytest.raises(ValidationError, match="not a header name"):
        ShadowConfig(header="x session")
    with pytest.raises(ValidationError):
        ShadowConfig(rate=1.5)


def test_hop_by_hop_headers_stay_on_their_connection() -> None:
    client = [
        (b"host", b"mirror:8080"),
        (b"authorization", b"Bearer sk"),
        (b"content-type", b"application/json"),
        (b"content-length", b"10"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"accept-encoding", b"gzip"),
        (b"x-shadow-pair-id", b"spoofed"),
        (b"x-session-id", b"abc"),
    ]
    up = upstream_headers(client, b"pair-1")
    assert up == [
        (b"authorization", b"Bearer sk"),
        (b"content-type", b"application/json"),
        (b"accept-encoding", b"gzip"),
        (b"x-session-id", b"abc"),
        (PAIR_HEADER, b"pair-1"),
    ]
    assert (b"accept-encoding", b"gzip") not in shadow_headers(up)
    assert (PAIR_HEADER, b"pair-1") in shadow_headers(up)
    resp = [
        (b"Content-Type", b"text/event-stream"),
        (b"Content-Length", b"99"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Date", b"x"),
    ]
    assert client_headers(resp, b"p", rechunked=False) == [
        (b"content-type", b"text/event-stream"),
        (b"content-length", b"99"),
        (b"date", b"x"),
        (PAIR_HEADER, b"p"),
    ]
    assert (b"content-length", b"99") not in client_headers(resp, b"p", rechunked=True)


def test_candidate_header_overrides_replace_the_clients() -> None:
    client = [("Authorization", "Bearer client"), ("x-a", "1")]
    extra = [("authorization", "Bearer candidate")]
    assert override_headers(client, extra) == [("x-a", "1"), ("authorization", "Bearer candidate")]
    assert override_headers(client, []) is client


def test_top_logprobs_asked_where_the_request_did_not() -> None:
    chat = {"model": "m", "messages": [], "temperature": 0}
    assert with_top_logprobs(chat, chat=True, k=5) == {**chat, "logprobs": True, "top_logprobs": 5}
    bare = {**chat, "logprobs": True}  # logprobs without alternatives: alternatives added
    assert with_top_logprobs(bare, chat=True, k=5) == {**bare, "top_logprobs": 5}
    asked = {**chat, "logprobs": True, "top_logprobs": 2}
    assert with_top_logprobs(asked, chat=True, k=5) is None  # the client's own choice kept
    cmpl = {"model": "m", "prompt": "p"}
    assert with_top_logprobs(cmpl, chat=False, k=5) == {**cmpl, "logprobs": 5}
    assert with_top_logprobs({**cmpl, "logprobs": 0}, chat=False, k=5) == {**cmpl, "logprobs": 5}
    assert with_top_logprobs({**cmpl, "logprobs": 3}, chat=False, k=5) is None
    assert chat == {"model": "m", "messages": [], "temperature": 0}  # never mutated
    body, done = ask_top_logprobs(chat, ["model"], chat=True, k=None)
    assert body is chat and done == ["model"]  # off
    body, done = replay_request(
        cmpl,
        ["stream_options.include_usage"],
        chat=False,
        top_logprobs=4,
        delay_s=1.5,
        cache_salt="s1",
    )
    assert body == {**cmpl, "logprobs": 4, "cache_salt": "s1"}
    assert done == [
        "stream_options.include_usage",
        "logprobs",
        "cache_salt",
        "replay_delay:1.5",
        "replay_pool:separate",
    ]
