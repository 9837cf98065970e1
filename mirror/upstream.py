"""Raw HTTP/1.1 connections to an engine: the client server's to the incumbent
(:mod:`mirror.server`) and the shadow side's (:mod:`mirror.shadow_client`).

An :class:`UpstreamConnection` is an :class:`asyncio.Protocol` with an ``httptools`` response
parser: the incumbent's bytes are parsed in ``data_received`` and handed, in the same call, to
the :class:`Exchange` that asked (its ``head``, ``body``, ``done`` and ``broken``), which writes
them to the client's transport. No stream reader, future or task wake-up per chunk.
:class:`Upstream` keeps the idle keep-alive connections (newest first, none older than
``keepalive_s``, :data:`KEEPALIVE_S` in the mirror), opens a new connection when none is idle
(no cap: ``shadow.max_concurrent`` bounds the shadow side, the client connections the
incumbent's), and times the connect (:data:`CONNECT_TIMEOUT_S`). A URL's user info is not used
here: the mirror's own credentials for an engine are headers its callers add
(:meth:`mirror.config.EngineConfig.own_headers`).

Errors: :meth:`Upstream.acquire` raises :class:`TimeoutError` (connect timeout) or
:class:`OSError` (refused, unreachable, TLS); a connection that breaks reports
:class:`ConnectionError` to its exchange.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Protocol

import httptools
import yarl

if TYPE_CHECKING:
    from mirror.config import EngineConfig

CONNECT_TIMEOUT_S = 5.0
"""TCP connect timeout to either engine (``incumbent``/``candidate.connect_timeout_s`` until
issue 26): the engines sit next to the mirror, so a connect that takes seconds is a dead
engine, not a slow one."""

KEEPALIVE_S = 4.0
"""A pooled connection idle longer than this is not reused (``incumbent``/
``candidate.keepalive_timeout_s`` until issue 26): under the engines' own keep-alive (vLLM and
uvicorn: 5 s), else a request can go out on a connection the engine is closing and fail as a
connection error (tests/mirror/test_mirror_keepalive.py plays that race)."""


class Exchange(Protocol):
    """What an upstream connection reports to, per response (never raises)."""

    def head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def body(self, data: bytes) -> None: ...

    def done(self, keep_alive: bool) -> None: ...

    def broken(self, exc: Exception) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One connection to the incumbent; one exchange at a time."""

    def __init__(self, pool: Upstream) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.received = False  # a byte of the current response arrived
        self.framed = True  # the current response has a length or chunks (else: ends at close)
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # nothing asked: the incumbent is confused; drop it
            self.close()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            self._fail(ConnectionError(f"the incumbent's answer could not be passed on: {exc}"))
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the incumbent's answer is not HTTP/1.1: {exc}"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        ex = self.exchange
        if ex is None:
            return
        self.exchange = None
        if self.received and not self.framed and self.headers_done:
            ex.done(False)  # a body delimited by the connection's close is complete
            return
        ex.broken(
            ConnectionError(f"the incumbent closed the connection{f': {exc}' if exc else ''}")
        )

    # -- httptools callbacks ------------------------------------------------------------------

    headers_done = False

    def on_message_begin(self) -> None:
        self.headers = []
        self.headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        framed = False
        for name, value in self.headers:
            low = name.lower()
            if low == b"content-length" or (low == b"transfer-encoding" and b"chunked" in value):
                framed = True
                break
        status = self.parser.get_status_code()
        self.framed = framed or status in (204, 304) or status < 200
        if self.exchange is not None:
            self.exchange.head(status, self.headers)

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            self.exchange.body(body)

    def on_message_complete(self) -> None:
        ex = self.exchange
        self.exchange = None
        if ex is not None:
            ex.done(self.parser.should_keep_alive())

    # -- use ----------------------------------------------------------------------------------

    def send(self, exchange: Exchange, data: bytes) -> None:
        """Write a whole request; its response goes to ``exchange``."""
        assert self.transport is not None
        self.exchange = exchange
        self.received = False
        self.framed = True
        self.headers_done = False
        self.transport.write(data)

    def _fail(self, exc: Exception) -> None:
        ex = self.exchange
        self.exchange = None
        self.close()
        if ex is not None:
            ex.broken(exc)

    def pause(self) -> None:
        if self.transport is not None and not self.closed and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed and self.paused:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (an engine sees it go and stops generating)."""
        self.exchange = None
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


class Upstream:
    """A keep-alive pool of :class:`UpstreamConnection` to one engine URL."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        u = yarl.URL(url)
        self.host = u.raw_host or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None
        )
        default = (u.scheme == "https" and self.port == 443) or (
            u.scheme == "http" and self.port == 80
        )
        self.host_header = (self.host if default else f"{self.host}:{self.port}").encode()
        self.prefix = u.raw_path.rstrip("/")
        """The engine URL's path (``http://host/prefix``): request targets start with it."""
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.idle: list[UpstreamConnection] = []
        self.open = 0
        self.closing = False

    @classmethod
    def to(cls, engine: EngineConfig, *, keepalive_s: float = KEEPALIVE_S) -> Upstream:
        """An uncapped pool to ``engine`` (``shadow.max_concurrent`` bounds the shadow side,
        the client connections the incumbent's) with the mirror's connect timeout and
        keep-alive."""
        return cls(engine.url, connect_timeout_s=CONNECT_TIMEOUT_S, keepalive_s=keepalive_s)

    async def acquire(self) -> tuple[UpstreamConnection, bool]:
        """A connection (and whether it was used before): an idle one, else a new one."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self.idle:
            conn = self.idle.pop()
            if conn.closed or now - conn.idle_since > self.keepalive_s:
                conn.close()
                continue
            return conn, True
        self.open += 1
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                ),
                self.connect_timeout_s,
            )
        except BaseException:
            self.open -= 1
            raise
        return proto, False

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        """Give a connection back after its response: kept when ``reusable``, else closed."""
        if not reusable or conn.closed or self.closing:
            conn.close()
            return
        conn.resume()  # paused for a slow client: the next exchange reads it again
        conn.idle_since = asyncio.get_running_loop().time()
        self.idle.append(conn)

    def _lost(self, conn: UpstreamConnection) -> None:
        self.open -= 1
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        self.closing = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()
