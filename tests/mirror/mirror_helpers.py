"""Shared helpers of the mirror tests (a module with a unique name, importable by tests)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from aiohttp import web
from factories import ListSink as ListSink  # used by the mirror tests from here
from sqlalchemy import text

from mirror import metrics as m
from shadow_ab.dev.processes import free_port
from storage.db import make_engine

MODEL = "sim-llama-3-8b-instruct"

FAST: dict[str, Any] = {
    "latency": {"decode_ms": 2.0, "prefill_base_ms": 2.0, "prefill_per_token_ms": 0.0},
    "answers": {"min_tokens": 8, "max_tokens": 24},
}
"""Simulator overrides: short, quick answers (the tests are about bytes and records)."""


_ID = re.compile(rb'"id":\s*"[^"]*"')
_CREATED = re.compile(rb'"created":\s*\d+')


def decisions() -> dict[str, float]:
    """The in-process mirror's shadow decisions so far (``shadow_ab_mirror_shadow_decisions_total``
    by decision: the metric is process-wide, so a test takes the difference)."""
    return {
        s.labels["decision"]: s.value
        for metric in m.SHADOW_DECISIONS.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def normalize(body: bytes) -> bytes:
    """An answer's bytes with the per-request ``id`` and ``created`` values blanked out."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":"-"', body))


def post(
    client: httpx.Client, url: str, body: dict[str, Any] | bytes, **headers: str
) -> tuple[int, dict[str, str], bytes, float]:
    """POST and read the whole answer: (status, headers, body bytes, seconds to the end)."""
    content = body if isinstance(body, bytes) else None
    t0 = time.monotonic()
    with client.stream(
        "POST",
        url,
        content=content,
        json=None if content is not None else body,
        headers={"content-type": "application/json", **headers},
    ) as resp:
        raw = resp.read()
    return resp.status_code, dict(resp.headers), raw, time.monotonic() - t0


def rows(database_url: str, where: str = "1=1", **params: Any) -> list[dict[str, Any]]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            result = conn.execute(text(f"SELECT * FROM exchanges WHERE {where}"), params)
            return [dict(r._mapping) for r in result]
    finally:
        engine.dispose()


def wait_rows(
    database_url: str, count: int, where: str = "1=1", timeout: float = 15.0, **params: Any
) -> list[dict[str, Any]]:
    """Rows matching ``where`` once there are at least ``count`` (the sink batches writes)."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = rows(database_url, where, **params)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"expected {count} rows where {where}, found {len(found)}: {found}")


def pair_key(pair_id: str, database_url: str) -> str:
    """``pair_id`` as the store keeps it (SQLite: 32 hex digits; PostgreSQL: a uuid)."""
    return pair_id.replace("-", "") if database_url.startswith("sqlite") else pair_id


@contextlib.contextmanager
def entered_together(*managers: contextlib.AbstractContextManager[Any]) -> Iterator[list[Any]]:
    """Enter several context managers at once (each in its own thread: subprocesses start in
    parallel), exit them in reverse order in this thread."""
    with ThreadPoolExecutor(max_workers=max(1, len(managers))) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
    entered: list[tuple[contextlib.AbstractContextManager[Any], Any]] = []
    error: BaseException | None = None
    for manager, future in zip(managers, futures, strict=True):
        try:
            entered.append((manager, future.result()))
        except BaseException as exc:
            error = error or exc
    try:
        if error is not None:
            raise error
        yield [value for _, value in entered]
    finally:
        for manager, _ in reversed(entered):
            manager.__exit__(None, None, None)


def chat_answer(content: str, prompt_tokens: int = 1) -> dict[str, Any]:
    """A whole (non-streamed) chat completion answering ``content`` in one token."""
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 1,
            "total_tokens": prompt_tokens + 1,
        },
    }


class StandInEngine:
    """An aiohttp server on a free port, in a thread of its own, for what the simulator cannot
    do; subclasses add routes in :meth:`routes`. A context manager: started and stopped."""

    def __init__(self) -> None:
        self.port = free_port()
        self._ready = threading.Event()
        self._loop: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        self.routes(app)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> Any:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.asynccontextmanager
async def served_in_process(mirror: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``mirror`` (a :class:`mirror.app.Mirror`) served in this event loop on a
    real socket by its client server (:mod:`mirror.server`). Runs the mirror's start-up, and its
    shutdown (the shadow requests drain, the sink flushes) after the block."""
    await mirror.startup()
    try:
        port = await mirror.server.listen()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                yield client
        finally:
            await mirror.server.drain()
    finally:
        await mirror.shutdown()


def served(admin_url: str) -> float:
    """Client requests a mirror process answered (its own /metrics)."""
    text = httpx.get(admin_url + "/metrics", timeout=10.0).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("shadow_ab_mirror_requests_total{")
    )


def ask(port: int, n: int, tag: str) -> list[str]:
    """``n`` chats, each on a new connection (the kernel picks a worker per connection)."""
    pairs = []
    for i in range(n):
        with httpx.Client(timeout=30.0) as http:
            resp = http.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"{tag} {i}"}],
                    "max_tokens": 4,
                    "temperature": 0,
                },
            )
        assert resp.status_code == 200
        pairs.append(resp.headers["x-shadow-pair-id"])
    return pairs
