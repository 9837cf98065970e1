"""Hostile candidate answers through the in-process mirror (issue 26): a gzip bomb, an endless
stream and an endless JSON body are cut at the cap, recorded as truncated (status
``connection_error``, error "answer truncated at N bytes"), counted, and never reach the client.
How much memory the cut answers
took is measured in tests/mirror/test_shadow_client.py."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from aiohttp import web
from mirror_helpers import MODEL, ListSink, StandInEngine, served_in_process
from prometheus_client import REGISTRY

from mirror.app import Mirror
from mirror.config import load_settings
from mirror.shadow_client import ANSWER_MAX_BYTES
from shadow_ab.dev.processes import RunningSim
from shadow_ab.records import ANSWER_TRUNCATED, ExchangeRecord, Role, Status

PAST_CAP = 32 * 1024 * 1024
"""How far past the cap the endless answers go before they stall (more than socket buffers
hold: an engine that wrote them all would not have seen the mirror close)."""


def _gzip_bomb(zeros: int) -> bytes:
    """``zeros`` zero bytes gzipped a megabyte at a time (~1 KB per MB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    mb = bytes(1024 * 1024)
    return b"".join([*(z.compress(mb) for _ in range(zeros // len(mb))), z.flush()])


class Hostile(StandInEngine):
    """A candidate answering by the chat's first message: ``bomb`` (200 MB of zeros gzipped),
    ``sse`` (an endless event stream) or ``json`` (a body announced as 100 GB, never ending).
    ``sent`` counts what each wrote; ``cut`` notes the ones that saw the mirror close."""

    def __init__(self) -> None:
        super().__init__()
        self.bomb = _gzip_bomb(200 * 1024 * 1024)
        self.sent: dict[str, int] = {}
        self.cut: set[str] = set()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        kind = (await request.json())["messages"][0]["content"]
        if kind == "bomb":
            return web.Response(
                body=self.bomb,
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            )
        resp = web.StreamResponse()
        if kind == "sse":
            resp.content_type = "text/event-stream"
            piece = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 900 + b'"}}]}\n\n'
        else:
            resp.content_type = "application/json"
            resp.content_length = 100 * 1024**3
            piece = b"[" * 65536
        await resp.prepare(request)
        self.sent[kind] = 0
        try:
            while self.sent[kind] < ANSWER_MAX_BYTES + PAST_CAP:
                await resp.write(piece)
                self.sent[kind] += len(piece)
            await asyncio.sleep(60)  # stall, the connection open
        except (ConnectionError, asyncio.CancelledError):
            self.cut.add(kind)
            raise
        return resp


def truncated_total(role: str) -> float:
    labels = {"role": role}
    return REGISTRY.get_sample_value("shadow_ab_mirror_shadow_answers_truncated_total", labels) or 0


def test_hostile_answers_are_cut_recorded_as_truncated_and_counted(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    kinds = ["bomb", "sse", "json"]
    before = truncated_total("candidate")
    with Hostile() as candidate:
        s = load_settings(
            None,
            incumbent={"url": engines[0].base_url},
            candidate={"url": candidate.url},
            shadow={"timeout_s": 30.0},
            health_enabled=False,
            database_url="sqlite:///unused.db",
        )
        sink = ListSink()

        async def main() -> list[int]:
            mirror = Mirror(s, sink=sink)
            async with served_in_process(mirror) as client:
                answers = [
                    await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "messages": [{"role": "user", "content": kind}],
                            "max_tokens": 4,
                        },
                    )
                    for kind in kinds
                ]
            return [a.status_code for a in answers]

        assert asyncio.run(main()) == [200] * 3  # the client had the incumbent's answers
        sent, cut = dict(candidate.sent), set(candidate.cut)
    cand: list[Any] = [
        r for r in sink.records if isinstance(r, ExchangeRecord) and r.role is Role.CANDIDATE
    ]
    assert len(cand) == 3
    for r in cand:
        assert r.status is Status.CONNECTION_ERROR, (r.status, r.error)
        assert (r.error or "").startswith(f"{ANSWER_TRUNCATED} at {ANSWER_MAX_BYTES} bytes"), (
            r.error
        )
        assert r.http_status == 200 and r.output_text is None and r.ttft_s is None
    assert truncated_total("candidate") == before + 3
    assert cut == {"sse", "json"}  # the endless ones saw the mirror close...
    assert all(n < ANSWER_MAX_BYTES + PAST_CAP for n in sent.values()), sent  # ...and stopped
