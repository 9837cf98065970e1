"""The SSE parser on both engines' framings (built by the simulator's wire module)."""

from __future__ import annotations

import pytest

from mirror.sse import (
    SSEParser,
    UsageHider,
    add_field,
    decode_data,
    fingerprint_field,
    finishes_without_fingerprint,
    is_usage_only,
    passes_whole,
)
from simulator.generate import Token
from simulator.wire import Flavor, Framer

TOKENS = [Token(1, " hello", -0.1, ((" hello", -0.1), (" hi", -2.0))), Token(2, " world", -0.2)]


def stream_bytes(flavor: Flavor, endpoint: str, *, usage: bool) -> bytes:
    f = Framer(flavor, endpoint, "m", stream=True, seq_no=1)
    out = []
    if endpoint == "chat":
        out.append(f.role_chunk(0, None))
    for i, t in enumerate(TOKENS):
        last = i == len(TOKENS) - 1
        out.append(
            f.token_chunk(
                0,
                [t],
                finish_reason="stop" if last else None,
                stop_reason=None,
                logprobs=None,
                text_offset=0,
                usage=None,
            )
        )
    if usage:
        out.append(f.usage_chunk(f.usage(3, len(TOKENS))))
    out.append(Framer.DONE)
    return b"".join(out)


def feed_all(parser: SSEParser, data: bytes, step: int) -> list:
    events = []
    for i in range(0, len(data), step):
        events.extend(parser.feed(data[i : i + step]))
    return events


@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_events_and_raw_bytes_survive_any_chunking(
    flavor: Flavor, endpoint: str, step: int
) -> None:
    data = stream_bytes(flavor, endpoint, usage=True)
    parser = SSEParser()
    events = feed_all(parser, data, step)
    # the raw bytes of the events are exactly the stream, in order
    assert b"".join(e.raw for e in events) == data
    assert parser.pending() == b""
    datas = [e.data for e in events]
    assert datas[-1] == b"[DONE]"
    n_chunks = len(TOKENS) + (1 if endpoint == "chat" else 0)
    objs = [decode_data(d) for d in datas[:-1]]
    assert all(o is not None for o in objs)
    assert len(objs) == n_chunks + 1
    assert [is_usage_only(d) for d in datas] == [False] * n_chunks + [True, False]


def test_trtllm_space_before_blank_line_is_part_of_the_data() -> None:
    data = stream_bytes("trtllm", "chat", usage=False)
    assert b"} \n\n" in data  # the framing this test is about
    events = SSEParser().feed(data)
    first = decode_data(events[0].data)
    assert first is not None and first["choices"][0]["delta"] == {"role": "assistant"}


def test_crlf_cr_comments_multiline_and_event_names() -> None:
    data = (
        b": keep-alive comment\r\n\r\n"
        b'event: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b'data:{"b":2}\r\r'
        b"id: 7\nretry: 10\nunknown\ndata: [DONE]\n\n"
        b'data: {"partial"'
    )
    for step in (1, 2, 3, len(data)):
        parser = SSEParser()
        events = feed_all(parser, data, step)
        assert [e.data for e in events] == [None, b'{"a":\n1}', b'{"b":2}', b"[DONE]"]
        assert events[1].event == "message"
        assert decode_data(events[1].data) == {"a": 1}
        assert b"".join(e.raw for e in events) + parser.pending() == data
        assert parser.pending() == b'data: {"partial"'


def test_trailing_cr_waits_for_the_next_byte() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r\n\r") == []
    events = parser.feed(b"\ndata: y\n\n")
    assert [e.data for e in events] == [b"x", b"y"]
    assert events[0].raw == b"data: x\r\n\r\n"


def test_decode_data_and_usage_detection_reject_what_is_not_a_usage_chunk() -> None:
    assert decode_data(b"[DONE]") is None
    assert decode_data(b"not json") is None
    assert decode_data(b"[1, 2]") is None
    assert decode_data(None) is None
    assert not is_usage_only(b'{"choices":[{"index":0}],"usage":{"completion_tokens":1}}')
    assert not is_usage_only(b'{"choices":[],"usage":null}')
    assert not is_usage_only(b'{"note":"\\"usage\\" \\"choices\\""}')
    assert is_usage_only(b'{"choices": [], "usage": {"completion_tokens": 1}}')


def test_fast_and_general_paths_agree_on_random_streams() -> None:
    import random

    rng = random.Random(7)
    pieces = [b"data: a", b"data:b", b"data", b"event: e", b": c", b"id: 1", b"x", b""]
    ends = [b"\n", b"\n", b"\n", b"\r\n", b"\r"]
    for _ in range(300):
        stream = b"".join(rng.choice(pieces) + rng.choice(ends) for _ in range(rng.randint(1, 12)))
        whole = SSEParser()
        got = whole.feed(stream)
        bytewise = SSEParser()
        want = [e for i in range(len(stream)) for e in bytewise._feed_any(stream[i : i + 1])]
        assert [(e.data, e.raw, e.event) for e in got] == [(e.data, e.raw, e.event) for e in want]
        assert whole.pending() == bytewise.pending()


def test_passes_whole_only_when_no_usage_event_can_hide_in_it() -> None:
    parser = SSEParser()
    token = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
    assert passes_whole(parser, token)
    assert passes_whole(parser, token + token)
    assert not passes_whole(parser, b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n')
    # a usage event whose data goes on in a second data: line
    assert not passes_whole(parser, b'data: {"choices":\ndata: [],"usage":{}}\n\n')
    assert not passes_whole(parser, token[:-1])  # ends mid-event
    assert not passes_whole(parser, token.replace(b"\n", b"\r\n"))
    parser.feed(b"data: {")
    assert not passes_whole(parser, token)  # an event is under way
    finish = b'data: {"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}\n\n'
    assert not passes_whole(SSEParser(), finish)  # a finish event may need its fingerprint
    assert not passes_whole(SSEParser(), finish.replace(b'":"stop', b'": "stop'))


# -- the fingerprint vLLM moves onto the usage event -------------------------------------------

FP = b'"system_fingerprint":"vllm-0.32.0-6549002a"'


def vllm_032(endpoint: str, *, usage: bool, n: int = 1) -> bytes:
    """A stream as real vLLM 0.32.0 writes it (bytes seen on the server from
    ``shadow-ab engine vllm serve``): without ``include_usage`` the fingerprint is the last
    member of each choice's finish chunk; with it, only on the usage chunk."""
    head = b'data: {"id":"x","object":"%s","created":1,"model":"tiny-llama","choices":[{'
    obj = b"chat.completion.chunk" if endpoint == "chat" else b"text_completion"
    out = []
    for i in range(n):
        for k, word in enumerate((b"Mo", b" golden")):
            finish = b'"length","stop_reason":null' if k == 1 else b"null"
            if endpoint == "chat":
                choice = b'"index":%d,"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s'
            else:
                choice = b'"index":%d,"text":"%s","logprobs":null,"finish_reason":%s'
            end = b"}]" + (b"," + FP if k == 1 and not usage else b"") + b"}\n\n"
            out.append(head % obj + choice % (i, word, finish) + end)
    if usage:
        out.append(
            head.split(b'"choices"')[0] % obj
            + b'"choices":[],"usage":{"prompt_tokens":2,"total_tokens":6,"completion_tokens":4},'
            + FP
            + b"}\n\n"
        )
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def hidden(stream: bytes, step: int) -> tuple[bytes, UsageHider]:
    hider = UsageHider()
    out = [hider.feed(stream[i : i + step], float(i)) for i in range(0, len(stream), step)]
    return b"".join(out) + hider.close(float(len(stream))), hider


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("step", [1, 13, 10_000])
def test_the_client_gets_vllms_stream_without_usage_byte_for_byte(
    endpoint: str, n: int, step: int
) -> None:
    asked = vllm_032(endpoint, usage=True, n=n)
    want = vllm_032(endpoint, usage=False, n=n)
    assert asked.count(FP) == 1 and want.count(FP) == n  # the move this is about
    got, hider = hidden(asked, step)
    assert got == want
    assert hider.held_s is not None and not hider.holding


def test_a_finish_event_is_held_only_until_the_usage_event() -> None:
    asked = vllm_032("chat", usage=True).split(b"\n\n")
    token, finish, usage, done = (e + b"\n\n" for e in asked[:4])
    hider = UsageHider()
    assert hider.feed(token, 1.0) == token
    assert hider.feed(finish, 2.0) == b"" and hider.holding
    assert hider.feed(usage, 2.5) == add_field(finish, b"," + FP)
    assert hider.held_s == 0.5
    assert hider.feed(done, 3.0) == done and hider.close(3.0) == b""


def test_what_has_no_fingerprint_to_give_back_passes_unchanged() -> None:
    # TensorRT-LLM: no fingerprint anywhere; the finish event waits for the usage event only
    data = stream_bytes("trtllm", "chat", usage=True)
    got, hider = hidden(data, 10_000)
    assert got == stream_bytes("trtllm", "chat", usage=False) and hider.held_s is not None
    # an engine that stamps every event keeps its own; nothing is held
    stamped = vllm_032("completions", usage=False).replace(b"}\n\n", b"," + FP + b"}\n\n")
    stamped = stamped.replace(b"," + FP + b"," + FP, b"," + FP)
    got, hider = hidden(stamped, 7)
    assert got == stamped and hider.held_s is None
    # a stream that ends (or breaks) before the usage event: the held events go out unchanged
    token, finish = vllm_032("chat", usage=True).split(b"\n\n")[:2]
    cut = token + b"\n\n" + finish + b"\n\n" + b"data: {"
    got, hider = hidden(cut, 10_000)
    assert got == cut and not hider.holding


def test_fingerprint_members_and_finish_detection() -> None:
    assert fingerprint_field(b'{"choices":[],"usage":{},"system_fingerprint":"a\\"b"}') == (
        b',"system_fingerprint":"a\\"b"'
    )
    assert fingerprint_field(b'{"choices": [], "system_fingerprint": "v"}') == (
        b', "system_fingerprint": "v"'
    )
    assert fingerprint_field(b'{"choices":[],"usage":{},"system_fingerprint":null}') is None
    assert fingerprint_field(b'{"choices":[],"usage":{}}') is None
    assert finishes_without_fingerprint(b'{"choices":[{"finish_reason":"stop"}]}')
    assert not finishes_without_fingerprint(b'{"choices":[{"finish_reason":null}]}')
    assert not finishes_without_fingerprint(
        b'{"choices":[{"finish_reason":"stop"}],"system_fingerprint":null}'
    )
    assert not finishes_without_fingerprint(
        b'{"choices":[{"delta":{"content":"\\"finish_reason\\":\\""}}]}'
    )
    assert add_field(b'data: {"a":1} \n\n', b',"b":2') == b'data: {"a":1,"b":2} \n\n'
    assert add_field(b"data: [DONE]\n\n", b',"b":2') == b"data: [DONE]\n\n"
