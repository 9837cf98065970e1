"""The traffic generator: request shapes, SSE parsing, client-side timings, load plans."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shadow_ab.dev.processes import RunningSim, free_port, running_sim
from shadow_ab.dev.traffic import (
    _SSE,
    PAIR_ID_HEADER,
    SESSION_HEADER,
    RequestGenerator,
    TrafficError,
    TrafficMix,
    make_plan,
    make_session,
    quantile,
    run_traffic,
    run_traffic_sync,
)

FAST = {
    "latency": {"decode_ms": 1.0, "prefill_base_ms": 2.0, "noise": 0.0},
    "answers": {"min_tokens": 4, "max_tokens": 24},
}


@pytest.fixture(scope="module", params=["vllm", "trtllm"])
def sim(request: pytest.FixtureRequest) -> Iterator[RunningSim]:
    # TensorRT-LLM answers 400 to any field it does not know: the mix must be valid there too.
    with running_sim(request.param, "clean", overrides=FAST, ledger=False) as s:
        yield s


# -- request shapes (no I/O) ---------------------------------------------------------------


def test_mix_is_deterministic_and_has_every_shape() -> None:
    mix = TrafficMix(sessions=8, max_turns=3)
    gen1, gen2 = RequestGenerator(mix, seed=7), RequestGenerator(mix, seed=7)
    specs = [gen1.next() for _ in range(600)]
    assert [s.body for s in specs] == [gen2.next().body for _ in range(600)]
    other = RequestGenerator(mix, seed=8)
    assert [s.body for s in specs[:20]] != [other.next().body for _ in range(20)]

    kinds = collections.Counter(s.kind.split("/")[0] for s in specs)
    assert kinds["chat"] > kinds["completions"] > 0
    assert 0.6 < sum(s.stream for s in specs) / len(specs) < 0.8
    assert all(isinstance(s.body["max_tokens"], int) for s in specs)
    assert all(s.body["model"] == "sim-llama-3-8b-instruct" for s in specs)
    sampled = [s for s in specs if s.body["temperature"] != 0]
    greedy = [s for s in specs if s.body["temperature"] == 0]
    assert sampled and greedy
    assert all("seed" in s.body for s in sampled)
    json_asks = [s for s in specs if "response_format" in s.body]
    assert 0.04 < len(json_asks) / len(specs) < 0.2
    assert all(s.body["response_format"] == {"type": "json_object"} for s in json_asks)
    # a few shared system prompts, short and long user prompts
    systems = {s.body["messages"][0]["content"] for s in specs if s.endpoint == "chat"}
    assert 1 < len(systems) <= 4
    lengths = [
        len(s.body["messages"][-1]["content"].split()) for s in specs if "messages" in s.body
    ]
    assert min(lengths) < 50 and max(lengths) > 300


def test_sessions_carry_their_turns_and_header() -> None:
    gen = RequestGenerator(TrafficMix(sessions=2, max_turns=4, chat_share=1.0), seed=1)
    specs = [gen.next() for _ in range(40)]
    assert all(s.headers[SESSION_HEADER] == s.session_id for s in specs)
    by_session: dict[str, list[int]] = collections.defaultdict(list)
    for s in specs:
        by_session[s.session_id].append(s.turn)
        # system + (turn - 1) earlier user/assistant pairs (at most 4) + this user prompt
        assert len(s.body["messages"]) == 2 + 2 * min(s.turn - 1, 4)
    assert len(by_session) > 2  # sessions end after max_turns and new ids replace them
    assert all(turns == list(range(1, len(turns) + 1)) for turns in by_session.values())
    assert max(len(t) for t in by_session.values()) == 4


def test_uniform_mode_is_one_shape() -> None:
    gen = RequestGenerator(TrafficMix.uniform(max_tokens=16), seed=0)
    specs = [gen.next() for _ in range(10)]
    assert {s.kind for s in specs} == {"chat/stream/greedy"}
    assert all(s.body == specs[0].body for s in specs)
    assert specs[0].body["max_tokens"] == 16


def test_invalid_mix_and_plan_say_what_to_fix() -> None:
    with pytest.raises(TrafficError, match="exactly one of concurrency"):
        make_plan(concurrency=2, rate=3.0, requests=1)
    with pytest.raises(TrafficError, match="requests"):
        make_plan(concurrency=2)
    with pytest.raises(TrafficError, match="low <= high"):
        TrafficMix.uniform(short_prompt_words=(10, 2))


def test_sse_parser_follows_the_spec() -> None:
    p = _SSE()
    assert p.feed(b'data: {"a": 1}\r\n\r\ndata: {"b"') == [b'{"a": 1}']
    assert p.feed(b": 2}\n\n") == [b'{"b": 2}']
    # TensorRT-LLM's framing (a space before the blank line), a comment, CR line ends
    assert p.feed(b'data: {"c": 3} \n\n: keep-alive\n\ndata:x\rdata: y\r') == [b'{"c": 3} ']
    assert p.feed(b"\r") == [b"x\ny"]
    # a CRLF split across chunks is one line end, not a blank line
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\ndata: b\n\n") == [b"a\nb"]
    assert p.feed(b"data: [DONE]\n") == []
    assert p.feed(b"\n") == [b"[DONE]"]


def test_quantile_interpolates() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert quantile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    assert quantile([5.0], 0.99) == 5.0


# -- against the simulator -----------------------------------------------------------------


def test_mix_against_simulator(sim: RunningSim) -> None:
    result = run_traffic_sync(
        sim.base_url, TrafficMix(long_prompt_words=(100, 200)), concurrency=6, requests=60
    )
    assert len(result.rows) == 60
    assert [r.index for r in result.rows] == list(range(60))
    assert result.errors == [], [r.error for r in result.errors]
    for r in result.rows:
        assert r.status == 200 and r.bytes > 0
        assert r.e2e_s is not None and r.done_s is not None and r.e2e_s <= r.done_s
        assert r.pair_id is None  # no mirror in between
        if r.stream:
            assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
            assert r.events >= 1
        else:
            assert r.ttft_s is None
            assert r.completion_tokens is not None and r.completion_tokens >= 1
    assert result.p50("ttft_s") <= result.p99("ttft_s")
    assert result.p50("e2e_s") <= result.p95("e2e_s") <= result.p99("e2e_s")
    assert result.requests_per_s > 0
    assert result.summary()["ok"] == 60


def test_uniform_open_loop_against_simulator(sim: RunningSim) -> None:
    result = run_traffic_sync(
        sim.v1, TrafficMix.uniform(max_tokens=8), rate=200.0, arrivals="even", requests=20
    )
    assert len(result.rows) == 20 and not result.errors
    assert {r.kind for r in result.rows} == {"chat/stream/greedy"}
    # every streamed answer of the uniform shape is timed: TTFT then E2E
    assert all(r.ttft_s is not None and r.e2e_s is not None for r in result.rows)
    assert all(r.ttft_s <= r.e2e_s for r in result.rows if r.ttft_s and r.e2e_s)
    # arrivals are evenly spaced 5 ms apart whatever the answers do (open loop)
    starts = [r.sent_at for r in result.rows]
    assert starts == sorted(starts)
    assert starts[-1] >= 19 * 0.005 * 0.9


# -- errors and the mirror's header, on a small server of our own ------------------------------


async def _fake_mirror(request: web.Request) -> web.StreamResponse:
    if request.headers.get(SESSION_HEADER, "").endswith(("-3", "-5")):
        return web.json_response({"error": "boom"}, status=500, headers={PAIR_ID_HEADER: "p-err"})
    resp = web.StreamResponse(headers={PAIR_ID_HEADER: "p-ok", "content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n')
    await resp.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
    await resp.write(
        b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n'
    )
    return resp


def test_errors_and_pair_ids_are_recorded() -> None:
    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _fake_mirror)
        async with TestServer(app, host="127.0.0.1") as server, make_session() as session:
            mix = TrafficMix.uniform(sessions=8)
            result = await run_traffic(
                session, str(server.make_url("/")), mix, make_plan(concurrency=2, requests=8)
            )
            by_status = collections.Counter((r.status, r.error, r.pair_id) for r in result.rows)
            assert by_status == {(200, None, "p-ok"): 6, (500, "http_500", "p-err"): 2}
            ok = result.ok_rows[0]
            assert ok.events == 2 and ok.completion_tokens == 2
            assert ok.ttft_s is not None and ok.e2e_s is not None
            # nothing listens on this port: a connection error, status 0, no timings
            dead = await run_traffic(
                session,
                f"http://127.0.0.1:{free_port()}",
                mix,
                make_plan(concurrency=1, requests=1),
            )
            row = dead.rows[0]
            assert row.status == 0 and row.error and row.error.startswith("connection_error")
            assert row.e2e_s is None and dead.requests_per_s == 0

    asyncio.run(go())


def test_open_loop_skips_beyond_max_in_flight() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return web.json_response({"choices": [{"text": "x"}]})

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", slow)
        async with TestServer(app, host="127.0.0.1") as server, make_session() as session:
            plan = make_plan(rate=100.0, arrivals="even", max_in_flight=2, requests=10)
            result = await run_traffic(
                session, str(server.make_url("/")), TrafficMix(chat_share=1.0, stream_share=0), plan
            )
            assert len(result.rows) == 2 and result.skipped == 8
            assert all(r.ok and r.ttft_s is None and r.e2e_s for r in result.rows)

    asyncio.run(go())
