"""The shadow side's raw-connection client (mirror/shadow_client.py) against a scripted engine:
what the engine receives, a kept-alive connection the engine dropped, compressed answers,
chunk arrival times, a header that would split the request, and hostile answers (a gzip bomb,
endless streams and bodies) cut at the cap."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from mirror.shadow_client import ANSWER_MAX_BYTES, AnswerTruncated, ShadowAnswer, request_head
from mirror.upstream import Upstream

Handler = Callable[[int, bytes, bytes], Awaitable[list[bytes] | None]]
"""(request number on its connection, head, body) -> the answer's pieces, or None: close.
A piece that is :data:`CLOSE` closes the connection there."""
CLOSE = b"<close>"


async def _engine(handler: Handler) -> tuple[asyncio.Server, int, list[bytes]]:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                heads.append(head)
                pieces = await handler(n, head, body)
                n += 1
                if pieces is None:
                    break
                for piece in pieces:
                    if piece is CLOSE:
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], heads


def _sse(events: list[bytes]) -> list[bytes]:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    out = [head]
    out += [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    out.append(b"0\r\n\r\n")
    return out


EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(3)] + [b"data: [DONE]\n\n"]


def test_a_stream_arrives_chunk_by_chunk_and_the_connection_is_kept() -> None:
    async def handler(n: int, head: bytes, body: bytes) -> list[bytes]:
        return _sse(EVENTS)

    async def main() -> None:
        server, port, heads = await _engine(handler)
        pool = Upstream(f"http://127.0.0.1:{port}", connect_timeout_s=5)
        try:
            for _ in range(2):
                answer = ShadowAnswer(asyncio.get_running_loop().time)
                hdrs = [("content-type", "application/json"), ("x-shadow-pair-id", "p")]
                head = request_head("POST", "/v1/chat/completions", pool, hdrs)
                await answer.fetch(pool, head, b'{"a":1}')
                assert answer.status == 200 and answer.sse and answer.broke is None
                assert b"".join(c for _, c in answer.stash) == b"".join(EVENTS)
                assert len(answer.stash) >= 2  # as they arrived, with their times
                times = [t for t, _ in answer.stash]
                assert times == sorted(times)
            assert pool.open == 1 and len(pool.idle) == 1  # one connection, kept alive
            assert heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"host: 127.0.0.1:%d\r\n" % port in heads[0]
            assert b"x-shadow-pair-id: p\r\n" in heads[0] and b"content-length: 7\r\n" in heads[0]
            assert b"authorization" not in heads[0].lower()
        finally:
            pool.close()
            server.close()

    asyncio.run(main())


def test_a_kept_alive_connection_the_engine_dropped_is_retried_once_on_a_new_one() -> None:
    async def handler(n: int, head: bytes, body: bytes) -> list[bytes] | None:
        if n == 1:  # the second request on a connection: dropped unanswered
            return None
        return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"]

    async def main() -> None:
        server, port, heads = await _engine(handler)
        pool = Upstream(f"http://127.0.0.1:{port}", connect_timeout_s=5)
        try:
            head = request_head("POST", "/v1/completions", pool, [])
            for _ in range(2):
                answer = ShadowAnswer(asyncio.get_running_loop().time)
                await answer.fetch(pool, head, b"{}")
                assert answer.status == 200 and b"".join(answer.parts) == b"{}"
                assert answer.last_t is not None and not answer.sse
            assert len(heads) == 3  # the dropped one, then its retry
        finally:
            pool.close()
            server.close()

    asyncio.run(main())


def test_a_connection_that_breaks_mid_answer_raises_and_keeps_what_arrived() -> None:
    async def handler(n: int, head: bytes, body: bytes) -> list[bytes]:
        return [*_sse(EVENTS)[:3], CLOSE]  # the head and two events, then the connection closes

    async def main() -> None:
        server, port, _ = await _engine(handler)
        pool = Upstream(f"http://127.0.0.1:{port}", connect_timeout_s=5)
        try:
            answer = ShadowAnswer(asyncio.get_running_loop().time)
            with pytest.raises(ConnectionError):
                await answer.fetch(pool, request_head("POST", "/", pool, []), b"")
            assert b"".join(c for _, c in answer.stash) == b"".join(EVENTS[:2])
            assert pool.open == 0 and not pool.idle
        finally:
            pool.close()
            server.close()

    asyncio.run(main())


def test_gzip_is_decompressed_and_the_urls_credentials_are_not_the_pools_to_add() -> None:
    """A gzip answer is decompressed; the pool adds no credentials of the URL's own (they are
    the mirror's own headers for that engine, mirror.config.EngineConfig.own_headers, added
    only where they belong), and a request's own Authorization goes as it is."""
    packed = gzip.compress(b'{"choices": []}')

    async def handler(n: int, head: bytes, body: bytes) -> list[bytes]:
        return [
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
            b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed),
            packed,
        ]

    async def main() -> None:
        server, port, heads = await _engine(handler)
        pool = Upstream(f"http://user:pw@127.0.0.1:{port}", connect_timeout_s=5)
        try:
            answer = ShadowAnswer(asyncio.get_running_loop().time)
            await answer.fetch(pool, request_head("POST", "/", pool, []), b"")
            assert answer.status == 500 and b"".join(answer.parts) == b'{"choices": []}'
            own = [("authorization", "Bearer own")]
            await ShadowAnswer(asyncio.get_running_loop().time).fetch(
                pool, request_head("POST", "/", pool, own), b""
            )
        finally:
            pool.close()
            server.close()
        assert b"authorization" not in heads[0].lower()
        assert b"authorization: Bearer own\r\n" in heads[1] and b"Basic" not in heads[1]

    asyncio.run(main())


def test_a_header_with_a_line_break_is_refused() -> None:
    pool = Upstream("http://127.0.0.1:1", connect_timeout_s=1)
    with pytest.raises(ValueError, match="line break"):
        request_head("POST", "/", pool, [("x-evil", "a\r\nhost: elsewhere")])


# -- hostile answers: the candidate is outside the trust boundary (issue 26) ----------------------

BOMB_BYTES = 200 * 1024 * 1024
"""Zeros in the gzip bomb: 200 MB, about 200 KB once compressed."""
PAST_CAP = 32 * 1024 * 1024
"""How far past the cap the endless answers go (then they stall, the connection open): more
than the kernel's socket buffers hold, so an engine writing them sees the mirror close."""


def _gzip_bomb(zeros: int) -> bytes:
    """``zeros`` zero bytes gzipped, compressed a megabyte at a time (the test never holds them)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    mb = bytes(1024 * 1024)
    out = [z.compress(mb) for _ in range(zeros // len(mb))]
    out.append(z.flush())
    return b"".join(out)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def _endless(
    head: bytes, first: bytes, piece: bytes, state: dict[str, Any]
) -> tuple[asyncio.Server, int]:
    """An engine answering ``head``, ``first``, then ``piece`` after ``piece`` (as chunks when
    ``head`` says chunked) until ``ANSWER_MAX_BYTES + PAST_CAP``, then stalling; ``state`` notes
    the bytes it wrote and whether it saw the mirror close the connection."""
    chunked = b"chunked" in head
    frame = _chunk(piece) if chunked else piece
    state.update(sent=0, closed=asyncio.Event())

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(head + (_chunk(first) if chunked and first else first))
            while state["sent"] < ANSWER_MAX_BYTES + PAST_CAP:
                writer.write(frame)
                state["sent"] += len(piece)
                await writer.drain()
            await reader.read()  # stall; returns when the mirror closes
        except ConnectionError:
            pass
        finally:
            state["closed"].set()
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _fetch_measured(port: int) -> tuple[ShadowAnswer, BaseException | None, int]:
    """Fetch from the engine on ``port`` under tracemalloc: the answer, what fetch raised, and
    the peak of memory allocated meanwhile."""
    pool = Upstream(f"http://127.0.0.1:{port}", connect_timeout_s=5)
    answer = ShadowAnswer(asyncio.get_running_loop().time)
    raised: BaseException | None = None
    tracemalloc.start()
    try:
        async with asyncio.timeout(30):
            await answer.fetch(pool, request_head("POST", "/", pool, []), b"{}")
    except Exception as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        pool.close()
    return answer, raised, peak


def _kept(answer: ShadowAnswer) -> int:
    return sum(len(p) for p in answer.parts) + sum(len(c) for _, c in answer.stash)


def test_a_gzip_bomb_is_decompressed_up_to_the_cap_only() -> None:
    bomb = _gzip_bomb(BOMB_BYTES)
    assert len(bomb) < 1024 * 1024 < ANSWER_MAX_BYTES < BOMB_BYTES  # a bomb, and past the cap
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        b"content-length: %d\r\n\r\n" % len(bomb)
    )

    async def handler(n: int, h: bytes, body: bytes) -> list[bytes]:
        return [head, *(bomb[i : i + 65536] for i in range(0, len(bomb), 65536))]

    async def main() -> tuple[ShadowAnswer, BaseException | None, int]:
        server, port, _ = await _engine(handler)
        try:
            return await _fetch_measured(port)
        finally:
            server.close()

    answer, raised, peak = asyncio.run(main())
    assert peak < ANSWER_MAX_BYTES + 16 * 1024 * 1024, peak  # before: the whole 200 MB, twice
    assert _kept(answer) <= ANSWER_MAX_BYTES
    assert isinstance(raised, AnswerTruncated), raised
    assert answer.truncated and f"answer truncated at {ANSWER_MAX_BYTES} bytes" in str(raised)


@pytest.mark.parametrize(
    "kind",
    ["endless-sse", "huge-json", "gzip-without-end"],
)
def test_an_endless_answer_is_cut_at_the_cap_and_its_connection_closed(kind: str) -> None:
    if kind == "endless-sse":
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        piece = b'data: {"choices":[{"index":0,"text":"' + b"x" * 900 + b'"}]}\n\n'
    elif kind == "huge-json":
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: 100000000000\r\n\r\n"
        )
        piece = b"[" * 65536  # a JSON document that never ends
    else:  # empty deflate blocks: nothing once decompressed, so the wire count must stop it
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        piece = b"\x00\x00\x00\xff\xff" * 13107  # 64 KiB of empty stored blocks
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = z.compress(b"") + z.flush(zlib.Z_SYNC_FLUSH) if kind == "gzip-without-end" else b""
    state: dict[str, Any] = {}

    async def main() -> tuple[ShadowAnswer, BaseException | None, int]:
        server, port = await _endless(head, first, piece, state)
        try:
            answer, raised, peak = await _fetch_measured(port)
            async with asyncio.timeout(10):
                await state["closed"].wait()  # the engine saw the connection go
            return answer, raised, peak
        finally:
            server.close()

    answer, raised, peak = asyncio.run(main())
    assert isinstance(raised, AnswerTruncated), raised  # before: TimeoutError after 30 s
    assert answer.truncated and _kept(answer) <= ANSWER_MAX_BYTES
    assert peak < ANSWER_MAX_BYTES + 16 * 1024 * 1024, peak
    assert state["sent"] < ANSWER_MAX_BYTES + PAST_CAP  # it stopped writing: the mirror closed
