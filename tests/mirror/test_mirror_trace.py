"""Timings and contents of one exchange, from plain values (docs/architecture.md, "Timing
definitions")."""

from __future__ import annotations

import dataclasses
import math
import uuid
from datetime import UTC, datetime

import orjson
import pytest
from pydantic import ValidationError

from mirror.recording import Dispatch, build_record, error_text, status_of
from mirror.sse import SSEParser
from mirror.trace import LOGPROB_FLOOR, Outcome, StreamTrace, parse_body, stream_trace
from shadow_ab.records import Endpoint, ExchangeRecord, Role, Status
from simulator.generate import Completion, Token
from simulator.wire import Flavor, Framer

TOP = ((" a", -0.1), (" b", -1.5), (" c", -3.0))
TOKENS = [
    Token(i, t, lp, TOP) for i, (t, lp) in enumerate([(" a", -0.1), (" b", -0.2), (" c", -0.3)])
]


def chunks(flavor: Flavor, endpoint: str, logprobs: int | None) -> list[bytes]:
    """One SSE write per token (the role chunk travels with the first), then usage + DONE."""
    f = Framer(flavor, endpoint, "m", stream=True, seq_no=1)
    out = []
    for i, t in enumerate(TOKENS):
        last = i == len(TOKENS) - 1
        piece = f.token_chunk(
            0,
            [t],
            finish_reason="length" if last else None,
            stop_reason=None,
            logprobs=logprobs,
            text_offset=i * 2,
            usage=None,
        )
        if i == 0 and endpoint == "chat":
            piece = f.role_chunk(0, None) + piece
        out.append(piece)
    out.append(f.usage_chunk(f.usage(5, len(TOKENS))) + Framer.DONE)
    return out


def trace_of(flavor: Flavor, endpoint: str, logprobs: int | None, times: list[float]) -> Outcome:
    trace = StreamTrace(100.0, chat=endpoint == "chat")
    parser = SSEParser()
    for t, piece in zip(times, chunks(flavor, endpoint, logprobs), strict=True):
        for e in parser.feed(piece):
            trace.add(t, e.data)
    return trace.outcome()


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stream_timings_follow_the_definitions(flavor: Flavor, endpoint: str) -> None:
    # tokens arrive at +0.040, +0.050, +0.070; the usage chunk at +0.500 moves nothing
    o = trace_of(flavor, endpoint, None, [100.040, 100.050, 100.070, 100.500])
    assert o.ttft_s == pytest.approx(0.040)
    assert o.e2e_s == pytest.approx(0.070)
    itl = [0.0, 0.010, 0.020] if endpoint == "chat" else [0.010, 0.020]  # role chunk: same write
    assert o.itl_s == pytest.approx(itl)
    assert o.completion_tokens == 3 and o.prompt_tokens == 5
    assert o.tpot_s == pytest.approx((0.070 - 0.040) / 2)
    assert o.output_text == " a b c"
    assert o.finish_reason == "length"
    assert o.logprobs is None
    assert o.bad_events == 0


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
def test_chat_logprobs_with_alternatives(flavor: Flavor) -> None:
    o = trace_of(flavor, "chat", 2, [1.0, 1.1, 1.2, 1.3])
    assert o.logprobs is not None
    assert [t.token for t in o.logprobs] == [" a", " b", " c"]
    assert [t.logprob for t in o.logprobs] == [-0.1, -0.2, -0.3]
    assert o.logprobs[0].top == {" a": -0.1, " b": -1.5}


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
def test_completion_logprobs_lists(flavor: Flavor) -> None:
    o = trace_of(flavor, "completions", 1, [1.0, 1.1, 1.2, 1.3])
    assert o.logprobs is not None
    assert [t.token for t in o.logprobs] == [" a", " b", " c"]
    assert o.logprobs[1].logprob == -0.2
    assert o.logprobs[0].top[" a"] == -0.1  # both flavors keep the top-1


def test_no_usage_means_no_tpot_and_a_broken_event_is_counted() -> None:
    trace = StreamTrace(0.0, chat=True)
    trace.add(0.5, b'{"choices":[{"index":0,"delta":{"content":"x"}}]}')
    trace.add(0.6, b"{not json")
    trace.add(0.7, b'{"choices":[{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}]}')
    trace.add(0.8, b"[DONE]")
    o = trace.outcome()
    assert (o.ttft_s, o.e2e_s, o.tpot_s) == (0.5, 0.7, None)
    assert o.itl_s == pytest.approx([0.2])
    assert o.bad_events == 1
    assert o.output_text == "xy" and o.finish_reason == "stop"


def test_empty_stream_has_no_timings() -> None:
    o = StreamTrace(0.0, chat=True).outcome()
    assert o.ttft_s is None and o.e2e_s is None and o.output_text is None


def test_other_choices_do_not_mix_into_the_text() -> None:
    trace = StreamTrace(0.0, chat=False)
    trace.add(0.1, b'{"choices":[{"index":1,"text":"B"}]}')
    trace.add(0.2, b'{"choices":[{"index":0,"text":"A"}]}')
    assert trace.outcome().output_text == "A"


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_non_streamed_body(flavor: Flavor, endpoint: str) -> None:
    f = Framer(flavor, endpoint, "m", stream=False, seq_no=1)
    body = f.response([Completion(TOKENS, "stop", text=" a b c")], 5, logprobs=1)
    o = parse_body(orjson.dumps(body), chat=endpoint == "chat", e2e_s=0.25)
    assert o.e2e_s == 0.25 and o.ttft_s is None and o.tpot_s is None
    assert o.output_text == " a b c"
    assert (o.prompt_tokens, o.completion_tokens, o.finish_reason) == (5, 3, "stop")
    assert o.logprobs is not None and [t.token for t in o.logprobs] == [" a", " b", " c"]


def test_non_finite_logprobs_are_floored_and_bad_bodies_counted() -> None:
    lp = {"tokens": ["x"], "token_logprobs": [None], "top_logprobs": [None]}
    body = orjson.dumps({"choices": [{"index": 0, "text": "x", "logprobs": lp}]})
    o = parse_body(body, chat=False, e2e_s=1.0)
    assert o.logprobs is not None and o.logprobs[0].logprob == LOGPROB_FLOOR
    assert math.isfinite(o.logprobs[0].logprob)
    assert parse_body(b"<html>", chat=True, e2e_s=1.0).bad_events == 1


def test_record_carries_dispatch_and_outcome() -> None:
    pair = uuid.uuid4()
    d = Dispatch(
        pair_id=pair,
        role=Role.CANDIDATE,
        engine="trtllm@candidate",
        endpoint=Endpoint.CHAT,
        stream=True,
        sent_at=datetime(2026, 1, 1, tzinfo=UTC),
        request={"model": "cand-model", "messages": []},
        rewrites=["model"],
        inflight_incumbent=3,
        inflight_candidate=1,
        guard={"state": "steady", "rate": 1.0},
    )
    o = Outcome(ttft_s=0.1, e2e_s=0.3, tpot_s=0.1, itl_s=[0.1, 0.1], completion_tokens=3)
    rec = build_record("dep", d, status=Status.OK, outcome=o, http_status=200)
    assert rec.pair_id == pair and rec.role is Role.CANDIDATE and rec.model == "cand-model"
    assert rec.rewrites == ["model"] and rec.guard["state"] == "steady"
    assert (rec.ttft_s, rec.e2e_s, rec.inflight_incumbent) == (0.1, 0.3, 3)
    err = build_record(
        "dep", d, status=status_of(500), http_status=500, error=error_text(b" boom ")
    )
    assert err.status is Status.HTTP_ERROR and err.error == "boom" and err.ttft_s is None
    assert status_of(204) is Status.OK
    # built without validation, yet exactly what validation gives
    for r in (rec, err):
        assert ExchangeRecord.model_validate(r.model_dump()) == r
        assert ExchangeRecord.model_validate_json(r.to_json()) == r
    # what build_record cannot vouch for is validated
    long_engine = dataclasses.replace(d, engine="e" * 201)
    with pytest.raises(ValidationError):
        build_record("dep", long_engine, status=Status.OK, outcome=o)


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stream_trace_matches_the_general_parser_on_any_cut(flavor: Flavor, endpoint: str) -> None:
    """The fast split of whole ``data:`` chunks gives what the spec parser gives, whatever the
    chunking and framing (CRLF, extra blank lines, multi-line data, comments)."""
    import random

    whole = b"".join(chunks(flavor, endpoint, 2))
    variants = [
        whole,
        whole.replace(b"\n", b"\r\n"),
        b": keep-alive\n\n" + whole.replace(b"\n\n", b"\n\n\n", 2),
        whole.replace(b'"choices":', b'"choices":\ndata: ', 1),
    ]
    rng = random.Random(7)
    for data in variants:
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, 12)))
            pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            if rng.random() < 0.5:  # event-aligned chunks, the engines' usual writes
                sep = b"\r\n\r\n" if b"\r" in data else b"\n\n"
                pieces = [p + sep for p in data.split(sep)[:-1]]
                assert b"".join(pieces) == data
            timed = [(float(i), p) for i, p in enumerate(pieces)]
            reference = StreamTrace(0.0, chat=endpoint == "chat")
            parser = SSEParser()
            for t, p in timed:
                for e in parser.feed(p):
                    reference.add(t, e.data)
            fast = stream_trace(timed, 0.0, chat=endpoint == "chat")
            assert fast.outcome() == reference.outcome()
            assert reference.outcome().events >= len(TOKENS)
