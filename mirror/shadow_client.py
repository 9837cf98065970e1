"""Shadow requests on raw connections: the candidate's and the replay's answers read through
:class:`mirror.upstream.Upstream` pools instead of aiohttp.

A shadow answer is read to the end and discarded; only its chunks' arrival times and bytes
matter (they are parsed after the end, :func:`mirror.trace.stream_trace`). On aiohttp each
chunk cost a stream-reader feed, a future and a task wake-up of the reading coroutine
(``iter_any``); here each chunk is one ``httptools`` callback inside the connection's
``data_received`` that appends ``(arrival time, bytes)`` to a list (:class:`ShadowAnswer`), and
the coroutine that asked wakes once, at the end. ``bench/shadow_cost.py`` measures both side by
side.

Isolation is the caller's (:mod:`mirror.shadow`): every shadow request runs in its own task
under ``shadow.timeout_s``; here a request that is cancelled or times out closes its connection
(the engine sees it go and stops generating), and a connection is given back to its pool only
after a complete answer the engine allowed to keep alive.

Differences from the aiohttp path: the engine gets no ``Accept: */*`` the client did not send;
a kept-alive connection the engine closed before answering is retried once on a new one (as the
protocol data plane does for the client's requests); an answer compressed with ``gzip`` or
``deflate`` is decompressed as it arrives (the candidate's aiohttp session did so too; shadow
requests never ask for compression), any other encoding is kept as it came.

Errors: :meth:`ShadowAnswer.fetch` raises :class:`TimeoutError` (connect timeout),
:class:`OSError` (refused, unreachable, TLS), :class:`ValueError` (a header with a line break),
and :class:`ConnectionError` when the connection breaks before the answer is complete (what
arrived until then stays in :attr:`ShadowAnswer.stash` / :attr:`ShadowAnswer.parts`).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from mirror.upstream import Upstream, UpstreamConnection

_DECODERS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": 0}


def request_head(
    method: str, path_qs: str, pool: Upstream, headers: list[tuple[str, str]]
) -> bytes:
    """The request line and headers for ``pool``'s engine (without ``content-length`` and the
    blank line); the URL's credentials (:attr:`Upstream.authorization`) unless ``headers``
    carry an ``Authorization``.

    Raises ValueError for a header name or value with a line break (it would split the request)."""
    lines = [f"{method} {path_qs} HTTP/1.1\r\nhost: {pool.host_header.decode('latin-1')}\r\n"]
    auth = pool.authorization
    for name, value in headers:
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name[:40]!r} holds a line break")
        if auth is not None and name.lower() == "authorization":
            auth = None
        lines.append(f"{name}: {value}\r\n")
    if auth is not None:
        lines.append(f"authorization: {auth.decode('latin-1')}\r\n")
    return "".join(lines).encode("latin-1")


class ShadowAnswer:
    """One shadow exchange's answer, as it arrives (an :class:`mirror.upstream.Exchange`)."""

    __slots__ = (
        "_decoder",
        "_fut",
        "_retried",
        "_retry",
        "broke",
        "clock",
        "conn",
        "keep",
        "last_t",
        "parts",
        "reused",
        "sse",
        "stash",
        "status",
    )

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.status: int | None = None
        self.sse = False
        self.stash: list[tuple[float, bytes]] = []
        """An SSE answer's chunks with their arrival times."""
        self.parts: list[bytes] = []
        """Any other answer's bytes."""
        self.last_t: float | None = None
        """When a non-SSE answer was complete."""
        self.broke: Exception | None = None
        self.keep = False
        self.conn: UpstreamConnection | None = None
        self.reused = False
        self._retry = False
        self._retried = False
        self._decoder: zlib._Decompress | None = None
        self._fut: asyncio.Future[None] | None = None

    async def fetch(self, pool: Upstream, head: bytes, body: bytes) -> None:
        """Send ``head`` (from :func:`request_head`) and ``body`` on a connection of ``pool``;
        return when the answer is complete. A cancel (the shadow timeout, the client leaving,
        the drain) closes the connection."""
        data = head + b"content-length: %d\r\n\r\n" % len(body) + body
        loop = asyncio.get_running_loop()
        try:
            for attempt in (0, 1):
                conn, self.reused = await pool.acquire()
                self.conn = conn
                self._fut = loop.create_future()
                conn.send(self, data)
                await self._fut
                if self._retry and attempt == 0:
                    self._retry = False  # a kept-alive connection the engine had closed
                    self._retried = True
                    continue
                break
            if self.broke is not None:
                raise self.broke
        finally:
            conn_ = self.conn
            self.conn = None
            if conn_ is not None:
                pool.release(conn_, self.keep and self.broke is None and self._fut_done())

    def _fut_done(self) -> bool:
        return self._fut is not None and self._fut.done() and not self._fut.cancelled()

    def _resolve(self) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    # -- UpstreamConnection callbacks (never raise) -------------------------------------------

    def head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        ctype = b""
        for name, value in headers:
            low = name.lower()
            if low == b"content-type":
                ctype = value.split(b";", 1)[0].strip().lower()
            elif low == b"content-encoding":
                wbits = _DECODERS.get(value.strip().lower())
                if wbits is not None:
                    self._decoder = zlib.decompressobj(wbits)
        self.sse = ctype == b"text/event-stream"

    def body(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as exc:
                self.broken(ConnectionError(f"the answer could not be decompressed: {exc}"))
                if self.conn is not None:
                    self.conn.close()
                return
        if self.sse:
            self.stash.append((self.clock(), data))
        else:
            self.parts.append(data)

    def done(self, keep_alive: bool) -> None:
        if not self.sse:
            self.last_t = self.clock()
        self.keep = keep_alive
        self._resolve()

    def broken(self, exc: Exception) -> None:
        if self._fut is None or self._fut.done():
            return
        conn = self.conn
        if (
            self.reused
            and not self._retried
            and self.status is None
            and conn is not None
            and not conn.received
        ):
            self._retry = True
        else:
            self.broke = exc
        self._resolve()


__all__ = ["ShadowAnswer", "request_head"]
