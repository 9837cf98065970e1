"""Pooled connections are not reused past ``keepalive_timeout_s``.

Real vLLM (uvicorn) closes a keep-alive connection idle for 5 s; aiohttp's pool kept one for
15 s by default. A request sent on a connection the engine is closing at that moment fails as a
connection error: ``bench/real_kernels.py`` saw 3 of 800 shadow requests fail so against two
real vLLMs on a busy machine ("Can not write request body", "Connection reset by peer"). The
upstream here plays that race deterministically: it answers the first request of each
connection and drops the connection on any later one, as an engine that timed it out just as
the request came in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from mirror_helpers import MODEL, ListSink

from mirror.app import Mirror
from mirror.config import load_settings
from shadow_ab.records import ExchangeRecord, Role, Status

ANSWER = orjson.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


async def one_request_per_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer the connection's first request (keep-alive); drop it at the next one."""
    answered = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if answered:
                writer.transport.abort()  # the engine closed it as the request arrived
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(ANSWER)}\r\n\r\n".encode()
                + ANSWER
            )
            await writer.drain()
            answered += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def twice_apart(keepalive_s: float, data_plane_pause_s: float) -> tuple[list[int], Any]:
    servers = [
        await asyncio.start_server(one_request_per_connection, "127.0.0.1", 0) for _ in range(2)
    ]
    inc_url, cand_url = (f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers)
    settings = load_settings(
        None,
        incumbent={"url": inc_url, "keepalive_timeout_s": keepalive_s},
        candidate={"url": cand_url, "keepalive_timeout_s": keepalive_s},
        shadow={"rate": 1.0, "replay_rate": 1.0, "replay_delay_s": 0.0},
        health_enabled=False,
        database_url="sqlite:///unused.db",
    )
    sink = ListSink()
    mirror = Mirror(settings, sink=sink)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    statuses = []
    await mirror.startup()
    try:
        transport = httpx.ASGITransport(app=mirror)
        async with httpx.AsyncClient(transport=transport, base_url="http://mirror") as client:
            for _ in range(2):
                resp = await client.post("/v1/chat/completions", json=body)
                statuses.append(resp.status_code)
                await asyncio.sleep(data_plane_pause_s)  # shadows done, connections idle
    finally:
        await mirror.shutdown()
        for server in servers:
            server.close()
            await server.wait_closed()
    return statuses, [r for r in sink.records if isinstance(r, ExchangeRecord)]


def test_a_connection_idle_past_the_keepalive_is_not_reused() -> None:
    statuses, records = asyncio.run(twice_apart(keepalive_s=0.2, data_plane_pause_s=0.5))
    assert statuses == [200, 200]
    assert len(records) == 6
    assert {r.role for r in records} == {Role.INCUMBENT, Role.CANDIDATE, Role.REPLAY}
    assert all(r.status is Status.OK for r in records), [(r.role, r.error) for r in records]


def test_within_the_keepalive_the_connection_is_reused() -> None:
    """The upstream's race is real: a connection reused within the keep-alive meets it (so the
    test above passes because the pool dropped its idle connections, not by luck)."""
    statuses, records = asyncio.run(twice_apart(keepalive_s=30.0, data_plane_pause_s=0.5))
    second = [r for r in records if r.role is not Role.INCUMBENT] + [
        r for r in records if r.role is Role.INCUMBENT
    ][1:]
    assert statuses[0] == 200 and statuses[1] != 200
    assert any(r.status is Status.CONNECTION_ERROR for r in second)
