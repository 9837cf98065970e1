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

    python bench/tee_floor.py --port 8081 --incumbent http://127.0.0.1:8000 \
        --candidate http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop


class Leg(asyncio.Protocol):
    """One kept connection to an engine: write a request's bytes, hand on the answer's bytes,
    call ``done`` when the answer ends (``httptools`` finds its end: length or chunked)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Callable[[bytes], object] | None = None
        self.done: Callable[[], object] | None = None
        self.keep = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def send(self, request: bytes, sink: Callable[[bytes], object] | None, done: Callable[[], object]) -> None:
        self.sink, self.done = sink, done
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()
        done, self.done, self.sink = self.done, None, None
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

    def __init__(self, incumbent: Pool, candidate: Pool) -> None:
        self.incumbent, self.candidate = incumbent, candidate
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
        asyncio.get_running_loop().create_task(self.exchange(request))
        asyncio.get_running_loop().create_task(tee(self.candidate, request))

    async def exchange(self, request: bytes) -> None:
        transport = self.transport
        assert transport is not None
        ended = asyncio.get_running_loop().create_future()
        leg = await self.incumbent.leg()
        leg.send(request, transport.write, lambda: ended.done() or ended.set_result(None))
        await ended
        if not transport.is_closing():
            transport.resume_reading()


async def tee(pool: Pool, request: bytes) -> None:
    """The candidate's copy: send, read to the end, drop."""
    ended = asyncio.get_running_loop().create_future()
    try:
        leg = await pool.leg()
    except OSError:
        return
    leg.send(request, None, lambda: ended.done() or ended.set_result(None))
    await ended


async def serve(port: int, incumbent: str, candidate: str) -> None:
    inc, cand = Pool(incumbent), Pool(candidate)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(inc, cand), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--incumbent", required=True)
    ap.add_argument("--candidate", required=True)
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.incumbent, args.candidate))


if __name__ == "__main__":
    main()
