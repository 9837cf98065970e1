"""The SSE parser on both engines' framings (built by the simulator's wire module)."""

from __future__ import annotations

import pytest

from mirror.sse import SSEParser, decode_data, is_usage_only, passes_whole
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
