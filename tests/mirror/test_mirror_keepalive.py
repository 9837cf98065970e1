"""Pooled connections are not reused past their keep-alive (``KEEPALIVE_S`` in mirror/upstream.py).

Real vLLM (uvicorn) closes a keep-alive connection idle for 5 s; aiohttp's pool kept one for
15 s by default. A request sent on a connection the engine is closing at that moment fails as a
connection error: ``bench/real_kernels.py`` saw 3 of 800 shadow requests fail so against two
real vLLMs on a busy machine ("Can not write request body", "Connection reset by peer"). The
upstream here plays that race deterministically: it answers the first request of each
connection and drops the connection on any later one, as an engine that timed it out just as
the request came in. The mirror retries a request once on a new connection when a kept one was
dropped before any answer byte, so the race shows in the upstream's count of dropped
connections, not in the client's status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from mirror_helpers import MODEL, ListSink, served_in_process

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


DROPPED = 0
"""Connections the upstream dropped as a request came in on them (a reused connection)."""


async def one_request_per_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer the connection's first request (keep-alive); drop it at the next one."""
    global DROPPED
    answered = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if answered:
                DROPPED += 1
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


async def twice_apart(keepalive_s: float, pause_s: float) -> tuple[list[int], Any, int]:
    global DROPPED
    DROPPED = 0
    servers = [
        await asyncio.start_server(one_request_per_connection, "127.0.0.1", 0) for _ in range(2)
    ]
    inc_url, cand_url = (f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers)
    settings = load_settings(
        None,
        incumbent={"url": inc_url},
        candidate={"url": cand_url},
        shadow={"rate": 1.0, "replay_rate": 1.0, "replay_delay_s": 0.0},
        health_enabled=False,
        database_url="sqlite:///unused.db",
    )
    sink = ListSink()
    mirror = Mirror(settings, sink=sink, keepalive_s=keepalive_s)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    statuses = []
    try:
        async with served_in_process(mirror) as client:
            for _ in range(2):
                resp = await client.post("/v1/chat/completions", json=body)
                statuses.append(resp.status_code)
                await asyncio.sleep(pause_s)  # shadows done, connections idle
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()
    return statuses, [r for r in sink.records if isinstance(r, ExchangeRecord)], DROPPED


def test_a_connection_idle_past_the_keepalive_is_not_reused() -> None:
    statuses, records, dropped = asyncio.run(twice_apart(keepalive_s=0.2, pause_s=0.5))
    assert statuses == [200, 200]
    assert dropped == 0  # no pooled connection outlived its keep-alive
    assert len(records) == 6
    assert {r.role for r in records} == {Role.INCUMBENT, Role.CANDIDATE, Role.REPLAY}
    assert all(r.status is Status.OK for r in records), [(r.role, r.error) for r in records]


def test_within_the_keepalive_the_connection_is_reused_and_the_race_retried() -> None:
    """The upstream's race is real: connections reused within the keep-alive meet it (so the
    test above passes because the pools dropped their idle connections, not by luck), and the
    mirror's one retry on a new connection hides it from the client and the records."""
    statuses, records, dropped = asyncio.run(twice_apart(keepalive_s=30.0, pause_s=0.5))
    assert dropped >= 2  # the incumbent's pool and the candidate's each met it
    assert statuses == [200, 200]
    assert all(r.status is Status.OK for r in records), [(r.role, r.error) for r in records]
