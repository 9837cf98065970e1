"""Shadow requests on raw connections: the candidate's and the replay's answers read through
:class:`mirror.upstream.Upstream` pools instead of aiohttp.

A shadow answer is read to the end (or to :data:`ANSWER_MAX_BYTES`, see below) and discarded;
only its chunks' arrival times and bytes matter (they are parsed after the end,
:func:`mirror.trace.stream_trace`). On aiohttp each chunk cost a stream-reader feed, a future
and a task wake-up of the reading coroutine (``iter_any``); here each chunk is one ``httptools``
callback inside the connection's ``data_received`` that appends ``(arrival time, bytes)`` to a
list (:class:`ShadowAnswer`), and the coroutine that asked wakes once, at the end.
``bench/shadow_cost.py`` measures both side by side.

Isolation is the caller's (:mod:`mirror.shadow`): every shadow request runs in its own task
under ``shadow.timeout_s``; here a request that is cancelled or times out closes its connection
(the engine sees it go and stops generating), and a connection is given back to its pool only
after a complete answer the engine allowed to keep alive.

Differences from the aiohttp path: the engine gets no ``Accept: */*`` the client did not send;
a kept-alive connection the engine closed before answering is retried once on a new one (as the
protocol data plane does for the client's requests); an answer compressed with ``gzip`` or
``deflate`` is decompressed as it arrives (the candidate's aiohttp session did so too; shadow
requests never ask for compression) a bounded step at a time, any other encoding (``br``,
``zstd``: never asked for either) is kept as it came, undecoded.

The candidate is outside the trust boundary: an answer is read up to :data:`ANSWER_MAX_BYTES`,
counted as received and after decompression. Past it the answer is cut: the connection is
closed (the engine sees it go and stops generating) and :meth:`ShadowAnswer.fetch` raises
:class:`AnswerTruncated` (recorded as ``connection_error``, its error saying "answer truncated
at N bytes", counted in ``shadow_ab_mirror_shadow_answers_truncated_total``).

Errors: :meth:`ShadowAnswer.fetch` raises :class:`TimeoutError` (connect timeout),
:class:`OSError` (refused, unreachable, TLS), :class:`ValueError` (a header with a line break),
and :class:`ConnectionError` when the connection breaks before the answer is complete, or
:class:`AnswerTruncated` (a :class:`ConnectionError`) when the answer outgrew the cap (what
arrived until then stays in :attr:`ShadowAnswer.stash` / :attr:`ShadowAnswer.parts`).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from mirror.upstream import Upstream, UpstreamConnection
from shadow_ab.records import ANSWER_TRUNCATED

ANSWER_MAX_BYTES = 64 * 1024 * 1024
"""The most of one shadow answer the mirror reads: 64 MiB, counted twice, as received (before
decompression) and as kept (after it, each kept piece charged :data:`PIECE_COST` more). Past
it the answer is cut (:class:`AnswerTruncated`) and its connection closed.

No real answer comes near: a vLLM chat stream event carrying one token with top-5 logprobs
(what the mirror asks the candidate for, ``shadow.top_logprobs``) is ~720 bytes, ~1,860 with
top-20 (the API's most); 32,768 tokens are then ~23 MiB (top-5) or ~58 MiB (top-20), and within
the default 120 s shadow timeout a stream of 500 tokens/s (faster than LLM decoding of one
request) makes 60,000 tokens, ~41 MiB at top-5. A non-streamed answer is smaller still (one
JSON object, no per-token envelope). A candidate sending more is broken or hostile: a gzip
bomb of 400 MB of zeros (~400 KB on the wire) once took the mirror from 109 MB to 1.35 GB.
A module constant, not a setting: nothing legitimate needs another value."""

PIECE_COST = 128
"""What one kept piece of an answer costs beyond its bytes, charged against
:data:`ANSWER_MAX_BYTES`: a bytes object's header (33 bytes), an SSE chunk's
``(time, bytes)`` tuple (56) and float (24), a list slot (8). Without it, an answer of many
one-byte chunks would cost the mirror a hundred times its counted size."""

DECODE_STEP = 256 * 1024
"""The most one decompression step produces (``zlib`` ``max_length``): the output of a
compressed piece is kept as pieces this size at most, so decompressing never allocates more
than this at once (a piece of 64 KiB of gzip can hold 64 MB)."""


class AnswerTruncated(ConnectionError):
    """A shadow answer outgrew :data:`ANSWER_MAX_BYTES`: cut there, its connection closed."""

    def __init__(self, cap: int, counted: str) -> None:
        super().__init__(
            f"{ANSWER_TRUNCATED} at {cap} bytes ({counted}; mirror.shadow_client."
            "ANSWER_MAX_BYTES): no real answer is this long; the mirror closed the connection"
        )


_DECODERS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": 0}


def request_head(
    method: str, path_qs: str, pool: Upstream, headers: list[tuple[str, str]]
) -> bytes:
    """The request line and headers for ``pool``'s engine (without ``content-length`` and the
    blank line).

    Raises ValueError for a header name or value with a line break (it would split the request)."""
    lines = [f"{method} {path_qs} HTTP/1.1\r\nhost: {pool.host_header.decode('latin-1')}\r\n"]
    for name, value in headers:
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name[:40]!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


class ShadowAnswer:
    """One shadow exchange's answer, as it arrives (an :class:`mirror.upstream.Exchange`)."""

    __slots__ = (
        "_decoder",
        "_fut",
        "_kept",
        "_received",
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
        "truncated",
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
        self.truncated = False
        """The answer outgrew :data:`ANSWER_MAX_BYTES` and was cut (``broke`` is then an
        :class:`AnswerTruncated`)."""
        self._received = 0
        self._kept = 0
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
        self._received += len(data)
        if self._received > ANSWER_MAX_BYTES:
            self._cut("as received")
            return
        decoder = self._decoder
        if decoder is None:
            self._keep(data)
            return
        # Decompressed a step at a time, each step's output bounded (``max_length``): never
        # ``decompress(all)``. ``full``: the last step filled its bound, so zlib may hold more.
        full = True
        while (data or full) and not decoder.eof:  # after the end: not part of the answer
            room = ANSWER_MAX_BYTES - self._kept - PIECE_COST
            if room <= 0:
                self._cut("decompressed")
                return
            step = min(room, DECODE_STEP)
            try:
                out = decoder.decompress(data, step)
            except zlib.error as exc:
                self.broken(ConnectionError(f"the answer could not be decompressed: {exc}"))
                if self.conn is not None:
                    self.conn.close()
                return
            data = decoder.unconsumed_tail
            full = len(out) == step
            if out and not self._keep(out):
                return

    def _keep(self, data: bytes) -> bool:
        """Keep one piece of the answer; False when it would outgrow the cap (then cut)."""
        self._kept += len(data) + PIECE_COST
        if self._kept > ANSWER_MAX_BYTES:
            self._cut("as kept")
            return False
        if self.sse:
            self.stash.append((self.clock(), data))
        else:
            self.parts.append(data)
        return True

    def _cut(self, counted: str) -> None:
        """Stop reading: the answer is truncated, its connection closed (the engine sees it go
        and stops generating); ``fetch`` raises :class:`AnswerTruncated`."""
        self.truncated = True
        self.broken(AnswerTruncated(ANSWER_MAX_BYTES, counted))
        if self.conn is not None:
            self.conn.close()

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
