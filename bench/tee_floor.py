"""The least a Python mirror on the mirror's own runtime can do: a floor for its CPU.

``bench/mirror_overhead.py --paths ...,floor`` runs this as a proxy path beside nginx and
``shadow-ab mirror``. Per client request it does what nginx's ``mirror`` directive does and
nothing more: forward the request's bytes to the incumbent, relay the answer's bytes to the
client as they arrive, send the same bytes to the candidate and read its answer to the end
and drop it. No parsing of the streams, no timings, no records, no privacy, no limits, no
metrics; keep-alive connections to both engines, ``uvloop`` and ``httptools`` as the mirror
uses them. What the mirror spends above this floor is the work its mission adds (two stream
parses, two records, privacy, the sink); what this floor spends above nginx's ``mirror`` is
the price of the language and runtime for the same two legs.

With ``--record FILE`` it also does the least of the mission's own work: each chunk of both
answers timed as it arrives, both streams parsed at their end (SSE events, ``orjson``) into
TTFT, the inter-token gaps, the text and the usage, and one record per side handed to a thread
that encodes it and appends it to FILE (cheaper than any real sink: no Kafka, no database, no
privacy, no limits). The mirror's CPU above *this* is what its implementation adds.

    python bench/tee_floor.py --port 8081 --incumbent http://127.0.0.1:8000 \
        --candidate http://127.0.0.1:8001 [--record /tmp/records.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import queue
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import cast
from urllib.parse import urlsplit

import httptools
import orjson
import uvloop

TASKS: set[asyncio.Task[None]] = set()
"""The exchanges under way (the loop keeps only weak references)."""

Chunks = list[tuple[float, bytes]]
"""An answer's body as it arrived: (monotonic time, bytes)."""


class Leg(asyncio.Protocol):
    """One kept connection to an engine: write a request's bytes, hand on the answer's bytes,
    call ``done`` when the answer ends (``httptools`` finds its end: length or chunked)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Callable[[bytes], object] | None = None
        self.done: Callable[[], object] | None = None
        self.chunks: Chunks | None = None
        self.keep = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def send(
        self,
        request: bytes,
        sink: Callable[[bytes], object] | None,
        done: Callable[[], object],
        chunks: Chunks | None = None,
    ) -> None:
        self.sink, self.done, self.chunks = sink, done, chunks
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(data)
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        if self.chunks is not None:
            self.chunks.append((time.monotonic(), body))

    def on_message_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()
        done, self.done, self.sink, self.chunks = self.done, None, None, None
        self.parser = httptools.HttpResponseParser(self)
        if self.keep:
            self.pool.idle.append(self)
        elif self.transport is not None:
            self.transport.close()
        if done is not None:
            done()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        if self.done is not None:
            done, self.done = self.done, None
            done()


class Pool:
    """Kept connections to one engine."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.idle: list[Leg] = []

    async def leg(self) -> Leg:
        if self.idle:
            return self.idle.pop()
        loop = asyncio.get_running_loop()
        _, leg = await loop.create_connection(lambda: Leg(self), self.host, self.port)
        return leg


class Client(asyncio.Protocol):
    """A client's connection: each whole request goes to both engines; the incumbent's
    answer goes back, byte for byte."""

    def __init__(self, incumbent: Pool, candidate: Pool, records: Records | None) -> None:
        self.incumbent, self.candidate, self.records = incumbent, candidate, records
        self.parser = httptools.HttpRequestParser(self)
        self.raw = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.raw += data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_complete(self) -> None:
        request = bytes(self.raw)
        self.raw.clear()
        assert self.transport is not None
        self.transport.pause_reading()
        pair = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        for job in (self.exchange(request, pair), tee(self.candidate, request, pair, self.records)):
            task = loop.create_task(job)
            TASKS.add(task)
            task.add_done_callback(TASKS.discard)

    async def exchange(self, request: bytes, pair: str) -> None:
        transport = self.transport
        assert transport is not None
        ended = asyncio.get_running_loop().create_future()
        leg = await self.incumbent.leg()
        chunks: Chunks | None = [] if self.records is not None else None
        t0 = time.monotonic()
        leg.send(request, transport.write, partial(settle, ended), chunks)
        await ended
        if not transport.is_closing():
            transport.resume_reading()
        if self.records is not None and chunks is not None:
            self.records.add(pair, "incumbent", t0, chunks)


async def tee(pool: Pool, request: bytes, pair: str, records: Records | None) -> None:
    """The candidate's copy: send, read to the end, drop (or record)."""
    ended = asyncio.get_running_loop().create_future()
    try:
        leg = await pool.leg()
    except OSError:
        return
    chunks: Chunks | None = [] if records is not None else None
    t0 = time.monotonic()
    leg.send(request, None, partial(settle, ended), chunks)
    await ended
    if records is not None and chunks is not None:
        records.add(pair, "candidate", t0, chunks)


def settle(ended: asyncio.Future[None]) -> None:
    if not ended.done():
        ended.set_result(None)


class Records:
    """One record per answer: parsed on the loop when the answer ends, encoded and written by
    a thread in batches."""

    def __init__(self, path: str) -> None:
        self.queue: queue.SimpleQueue[dict[str, object]] = queue.SimpleQueue()
        self.file = open(path, "ab")  # noqa: SIM115 - the writer thread owns it until exit
        threading.Thread(target=self._write, daemon=True).start()

    def add(self, pair: str, role: str, t0: float, chunks: Chunks) -> None:
        text: list[str] = []
        times: list[float] = []
        usage: object = None
        rest = b""
        for at, body in chunks:
            events = (rest + body).split(b"\n\n")
            rest = events.pop()
            for event in events:
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                obj = orjson.loads(event[6:])
                usage = obj.get("usage") or usage
                for choice in obj.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        text.append(delta["content"])
                        times.append(at)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        self.queue.put(
            {
                "pair": pair,
                "role": role,
                "ttft_s": times[0] - t0 if times else None,
                "e2e_s": chunks[-1][0] - t0 if chunks else None,
                "itl_s": gaps,
                "text": "".join(text),
                "usage": usage,
            }
        )

    def _write(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < 256:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            self.file.write(b"".join(orjson.dumps(r) + b"\n" for r in batch))
            self.file.flush()


async def serve(port: int, incumbent: str, candidate: str, record: str | None) -> None:
    inc, cand = Pool(incumbent), Pool(candidate)
    records = Records(record) if record else None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Client(inc, cand, records), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--incumbent", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--record", metavar="FILE", help="parse both answers, append records here")
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.incumbent, args.candidate, args.record))


if __name__ == "__main__":
    main()
