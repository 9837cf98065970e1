"""The client server: the mirror's client port on raw asyncio transports.

The client's connection (:class:`ClientConnection`) and the incumbent's
(:class:`mirror.upstream.UpstreamConnection`) are two :class:`asyncio.Protocol` s with
``httptools`` parsers: each chunk the incumbent sends is written to the client's transport
inside the incumbent connection's ``data_received`` (:class:`_Exchange`) and kept with its
arrival time; the record is parsed from the kept chunks after the answer is complete. No web
framework and no HTTP client library on the client's path.

What a generate request means is the exchange core's (:class:`mirror.exchange.ExchangeCore`:
``prepare`` once the body is read, ``settle`` once the answer is complete or cut); every other
request (pass-through routes, 400/404/405) is :class:`mirror.passthrough.Passthrough`'s,
through a minimal ASGI adapter (:class:`_AsgiResponse`). This module enforces the connection
limits of :mod:`mirror.limits` (431, 408, silent close of a silent connection, 503 over the
cap, the idle keep-alive timeout, the send timeout) and 413 for a body over
``max_body_bytes``.

Back-pressure both ways: while the client's transport buffer is over its high-water mark
(``pause_writing``) the incumbent's connection stops being read, and resumes on drain; a
client that pipelines more than :data:`PIPELINE_MAX` requests is not read until they are
answered. A client that disconnects cancels the incumbent request and the pair's shadow
requests (recorded as ``cancelled``). :meth:`ClientServer.drain` stops accepting and lets the
answers in flight finish (``drain_timeout_s``).

The incumbent is asked on this module's own keep-alive pool (:class:`mirror.upstream.Upstream`;
a kept connection the engine closed before answering is retried once on a new one); the
engine gets exactly the client's headers.

Errors: none raised to callers; the mirror's own answers are 502, 504, 413, 400 and the
limits' 408, 431, 503.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import socket
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools

from mirror import metrics as m
from mirror.exchange import ROUTES, SKIPPED_TOO_LARGE, ExchangeCore, Prepared
from mirror.headers import PAIR_HEADER, client_headers
from mirror.limits import (
    BODY_BUDGET,
    BODY_TIMEOUT,
    CONNECTION_CAP,
    HEADER_TIMEOUT,
    HEADER_TOO_LARGE,
    IDLE_CLOSED,
    limit_answers,
    linger,
)
from mirror.passthrough import Passthrough
from mirror.problem import PROBLEM_JSON, problem_body
from mirror.recording import status_of
from mirror.routes import canonical_path
from mirror.sse import UsageHider
from mirror.upstream import KEEPALIVE_S, Upstream, UpstreamConnection
from shadow_ab.privacy import redact_urls
from shadow_ab.records import Status

if TYPE_CHECKING:
    from mirror.config import MirrorSettings

log = logging.getLogger(__name__)

PIPELINE_MAX = 8
"""Requests parsed ahead of their answers on one connection before it stops being read."""

_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_NO_BODY = (204, 304)
_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 29\r\nconnection: close\r\n\r\nInvalid HTTP request received."
)
_TOO_LARGE = "too_large"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))
        if len(_STATUS_LINES) < 256:
            _STATUS_LINES[status] = line
    return line


def error_answer(status: int, message: str, err_type: str, pair_id: bytes = b"") -> bytes:
    """A whole answer of the mirror's own, closing the connection."""
    body = problem_body(status, message, err_type)
    head = [
        status_line(status),
        b"content-type: " + PROBLEM_JSON + b"\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    if pair_id:
        head.append(PAIR_HEADER + b": " + pair_id + b"\r\n")
    return b"".join(head) + b"\r\n" + body


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class _Request:
    __slots__ = ("body", "headers", "http11", "keep_alive", "method", "url")

    def __init__(
        self,
        method: str,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        http11: bool,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11


class ClientConnection(asyncio.Protocol):
    """One client connection: requests parsed with httptools, answered one at a time."""

    def __init__(self, server: ClientServer) -> None:
        self.server = server
        self.core = server.core
        self.loop = server.loop
        self.limits = server.limits
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.queue: collections.deque[_Request] = collections.deque()
        self.busy = False
        self.closed = False
        self.in_head = True
        self.head_bytes = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.reject: str | None = None
        self.exchange: _Exchange | None = None
        self.write_paused = False
        self.read_paused = False
        self.keep_alive = True
        self._gone: asyncio.Future[None] | None = None

    # -- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.limits.max_connections:
            self.closed = True
            m.EDGE_REJECTIONS.labels(reason=CONNECTION_CAP).inc()
            linger(self.transport, self.server.answers[CONNECTION_CAP], self.loop)
            return
        self.server.connections.add(self)
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose()

    def _lose(self) -> None:
        if self.closed and self not in self.server.connections:
            return
        self.closed = True
        self.server.connections.discard(self)
        self._cancel_timers()
        self._drop_bodies()
        if self.exchange is not None:
            self.exchange.client_gone()
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_late)
        if self.exchange is not None:
            self.exchange.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        if self.exchange is not None:
            self.exchange.resume()

    def _send_late(self) -> None:
        """The client took none of its answer for ``send_timeout_s``: the connection is
        dropped (what is buffered for it cannot be sent) and the engine's request cancelled."""
        self.send_timer = None
        if self.closed or not self.write_paused:
            return
        m.SEND_TIMEOUTS.inc()
        if self.exchange is not None:
            self.exchange.client_gone(
                f"the client took none of its answer for {self.limits.send_timeout_s:g}s"
                " (limits.send_timeout_s)"
            )
        self.transport.abort()
        self._lose()

    def _cancel_timers(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def gone(self) -> asyncio.Future[None]:
        """Resolved when the client's connection is lost."""
        if self._gone is None:
            self._gone = self.loop.create_future()
            if self.closed:
                self._gone.set_result(None)
        return self._gone

    def close(self) -> None:
        """Close after what was written is sent."""
        if not self.transport.is_closing():
            self.transport.close()
        self._lose()

    def shutdown(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its answer."""
        self.keep_alive = False
        if not self.busy and not self.queue:
            self.close()

    # -- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.in_head:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            reason = self.reject
            if reason is None:
                raise
            self._refuse(reason)
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._refuse_bytes(_BAD_REQUEST)
            return
        if self.in_head and not self.closed:
            if self.head_bytes > self.limits.max_header_bytes:
                self._refuse(HEADER_TOO_LARGE)
            elif self.head_timer is None:
                self.head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_late
                )

    def on_message_begin(self) -> None:
        self.in_head = True
        self.url = b""
        self.headers = []
        self.parts = []
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.limits.max_header_bytes:
            self.reject = HEADER_TOO_LARGE
            raise _Rejected
        self.in_head = False
        self.head_bytes = 0
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        limit = self.server.settings.max_body_bytes
        expect = False
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                if int(value) > limit:
                    self.reject = _TOO_LARGE
                    raise _Rejected
                if not self.server.may_hold(int(value)):
                    self.reject = BODY_BUDGET
                    raise _Rejected
            if name == b"expect" and value.lower() == b"100-continue":
                expect = True
        if expect:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.server.settings.max_body_bytes:
            self.reject = _TOO_LARGE
            raise _Rejected
        if not self.server.hold(len(body)):
            self.reject = BODY_BUDGET
            raise _Rejected
        self.held += len(body)
        self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        parts = self.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.held = 0  # the request's now: released when it is answered (or dropped)
        self.parts = []
        p = self.parser
        req = _Request(
            p.get_method().decode("latin-1"),
            self.url,
            self.headers,
            body,
            p.should_keep_alive(),
            p.get_http_version() == "1.1",
        )
        self.queue.append(req)
        if not self.busy:
            self._next()
        elif len(self.queue) >= PIPELINE_MAX and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    # -- refusals -----------------------------------------------------------------------------

    def _head_late(self) -> None:
        self.head_timer = None
        if self.closed or not self.in_head or self.busy:
            return
        if self.head_bytes:
            self._refuse(HEADER_TIMEOUT)
        else:  # never sent a byte of a request: closed without an answer (as nginx)
            m.EDGE_REJECTIONS.labels(reason=IDLE_CLOSED).inc()
            self.close()

    def _body_late(self) -> None:
        self.body_timer = None
        if self.closed:
            return
        if self.read_paused:  # the mirror stopped reading (pipelined requests), not the client
            self.body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)
            return
        self._refuse(BODY_TIMEOUT)

    def _refuse(self, reason: str) -> None:
        if reason == _TOO_LARGE:
            self._too_large()
            return
        m.EDGE_REJECTIONS.labels(reason=reason).inc()
        self._refuse_bytes(self.server.answers[reason])

    def _too_large(self) -> None:
        server = self.server
        path = canonical_path(_path_of(self.url))
        endpoint = ROUTES.get(path) if path is not None else None
        route = path if endpoint is not None and path is not None else "passthrough"
        if endpoint is not None:
            self.core.count_decision(SKIPPED_TOO_LARGE)
        limit = server.settings.max_body_bytes
        msg = f"request body is larger than the mirror's limit of {limit} bytes (max_body_bytes)"
        m.REQUESTS.labels(route=route, code="413").inc()
        self._refuse_bytes(error_answer(413, msg, "RequestTooLarge"))

    def _refuse_bytes(self, answer: bytes) -> None:
        """Answer and hand the connection to a lingering close (after any answer in flight)."""
        self._cancel_timers()
        self.in_head = False
        self._drop_bodies()
        if self.busy:  # answer after the one in flight, then close
            self.keep_alive = False
            self.pending_refusal = answer
            self.transport.pause_reading()
            return
        self.server.connections.discard(self)
        self.closed = True
        if not self.transport.is_closing():
            linger(self.transport, answer, self.loop)

    def _drop_bodies(self) -> None:
        """Forget the requests queued and the body being read, and release their bytes."""
        released = self.held + sum(len(r.body) for r in self.queue)
        self.held = 0
        self.queue.clear()
        self.server.release(released)

    pending_refusal: bytes | None = None
    responded = False  # the current request's answer has begun
    held = 0
    """Bytes of the body being read, counted in the server's body budget."""

    # -- answering ----------------------------------------------------------------------------

    def _next(self) -> None:
        if self.closed or not self.queue:
            return
        req = self.queue.popleft()
        self.busy = True
        self.responded = False
        if self.read_paused and len(self.queue) < PIPELINE_MAX:
            self.read_paused = False
            self.transport.resume_reading()
        self.loop.create_task(self._answer(req))

    async def _answer(self, req: _Request) -> None:
        keep = False
        try:
            keep = await self._dispatch(req)
        except Exception:
            log.exception("the mirror failed answering %s", req.method)
            if not self.closed and not self.responded:
                self.transport.write(error_answer(500, "the mirror failed", "InternalError"))
        finally:
            self.server.release(len(req.body))
            self._answered(keep and req.keep_alive and self.keep_alive)

    def _answered(self, keep: bool) -> None:
        self.busy = False
        if self.closed:
            return
        if self.pending_refusal is not None:
            answer, self.pending_refusal = self.pending_refusal, None
            self.server.connections.discard(self)
            self.closed = True
            if not self.transport.is_closing():
                linger(self.transport, answer, self.loop)
            return
        if not keep:
            self.close()
            return
        if self.queue:
            self._next()
            return
        self.idle_timer = self.loop.call_later(self.limits.idle_timeout_s, self._idle_late)

    def _idle_late(self) -> None:
        self.idle_timer = None
        if not self.busy and not self.queue and not self.closed:
            self.close()

    async def _dispatch(self, req: _Request) -> bool:
        """Answer one request; True when the connection may serve another."""
        parsed = httptools.parse_url(req.url)
        raw_path = parsed.path or b"/"
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        if not req.keep_alive:  # the client asked to close after this answer
            self.keep_alive = False
        if req.method == "POST":
            endpoint = ROUTES.get(path)
            route = path
            if endpoint is None:
                canonical = canonical_path(path)
                if canonical is not None:
                    endpoint = ROUTES.get(canonical)
                    route = canonical
            if endpoint is not None:
                p = self.core.prepare(req.headers, parsed.query or b"", req.body, endpoint, route)
                ex = _Exchange(self, p, route, req.http11)
                self.exchange = ex
                try:
                    return await ex.run()
                finally:
                    self.exchange = None
        scope: dict[str, Any] = {  # only the pass-through needs it: not on the generate path
            "type": "http",
            "method": req.method,
            "path": path,
            "raw_path": raw_path,
            "query_string": parsed.query or b"",
            "headers": req.headers,
            "http_version": "1.1" if req.http11 else "1.0",
        }
        return await self._asgi(req, scope)

    async def _asgi(self, req: _Request, scope: dict[str, Any]) -> bool:
        """Any other request, answered by :meth:`Passthrough.answer` through a minimal ASGI
        adapter."""
        resp = _AsgiResponse(self, req)
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await self.gone()
            return {"type": "http.disconnect"}

        try:
            await self.server.passthrough.answer(scope, receive, resp.send)
        except Exception:
            log.exception("the mirror failed answering %s %s", req.method, scope["path"][:200])
            if not resp.started and not self.closed:
                self.transport.write(error_answer(500, "the mirror failed", "InternalError"))
            return False
        return resp.complete and not resp.close


def _path_of(url: bytes) -> str:
    try:
        raw = httptools.parse_url(url).path or b"/"
    except httptools.HttpParserInvalidURLError:
        return "/"
    path = raw.decode("latin-1")
    return unquote(path) if "%" in path else path


class _AsgiResponse:
    """``send`` of the ASGI adapter: HTTP/1.1 on the client's transport."""

    def __init__(self, conn: ClientConnection, req: _Request) -> None:
        self.conn = conn
        self.head_only = req.method == "HEAD"
        self.http11 = req.http11
        self.started = False
        self.complete = False
        self.chunked = False
        self.close = not req.keep_alive

    async def send(self, msg: MutableMapping[str, Any]) -> None:
        transport = self.conn.transport
        if self.conn.closed or transport.is_closing():
            return
        if msg["type"] == "http.response.start":
            status = msg["status"]
            headers = msg.get("headers", [])
            out = [status_line(status)]
            length = False
            for name, value in headers:
                low = name.lower()
                if low == b"content-length":
                    length = True
                elif low == b"connection" and value.lower() == b"close":
                    self.close = True
                out.append(name + b": " + value + b"\r\n")
            bodiless = self.head_only or status in _NO_BODY or status < 200
            if not length and not bodiless:
                if self.http11:
                    self.chunked = True
                    out.append(b"transfer-encoding: chunked\r\n")
                else:
                    self.close = True
            if self.close or not self.conn.keep_alive:
                self.close = True
                out.append(b"connection: close\r\n")
            out.append(b"\r\n")
            self.started = True
            self.conn.responded = True
            self.bodiless = bodiless
            transport.write(b"".join(out))
            return
        body = msg.get("body", b"")
        if body and not self.bodiless:
            transport.write(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body)
        if not msg.get("more_body", False):
            if self.chunked:
                transport.write(b"0\r\n\r\n")
            self.complete = True
            if self.conn.write_paused:  # let the answer drain before the next one
                await asyncio.sleep(0)

    bodiless = False


class _Exchange:
    """One generate request's incumbent exchange: the incumbent connection's callbacks write
    straight to the client's transport."""

    def __init__(self, conn: ClientConnection, p: Prepared, route: str, http11: bool) -> None:
        self.conn = conn
        self.core = conn.core
        self.p = p
        self.route = route
        self.http11 = http11
        self.pid = str(p.d.pair_id).encode()
        self.clock = self.core.clock
        self.fut: asyncio.Future[None] = conn.loop.create_future()
        self.up: UpstreamConnection | None = None
        self.status = Status.OK
        self.http_status: int | None = None
        self.error: str | None = None
        self.client_code = 0
        self.sse = False
        self.hider: UsageHider | None = None
        self.stash: list[tuple[float, bytes]] = []
        self.parts: list[bytes] = []
        self.t0 = 0.0
        self.last_t: float | None = None
        self.last_read = 0.0
        self.first = True
        self.started = False  # the client got the head
        self.chunked = False
        self.bodiless = False
        self.complete = False
        self.keep_up = False
        self.gone = False
        self.connecting = False
        self.task: asyncio.Task[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None

    # -- the request --------------------------------------------------------------------------

    async def run(self) -> bool:
        """Ask the incumbent, pass its answer on; True when the client's connection may serve
        another request. Settles the record whatever happens."""
        self.task = asyncio.current_task()
        self.t0 = self.clock()
        try:
            await self._ask()
            if self.gone:
                return False
            return self.complete and not self.conn.closed
        except asyncio.CancelledError:
            if not self.gone or self.task is None:
                raise
            self.task.uncancel()
            return False
        finally:
            if self.timer is not None:
                self.timer.cancel()
            if self.up is not None:
                self.mirror_pool().release(self.up, self.keep_up and self.complete)
                self.up = None
            self.core.settle(
                self.p,
                route=self.route,
                client_code=self.client_code,
                status=self.status
                if self.complete or self.status is not Status.OK
                else Status.CONNECTION_ERROR,
                http_status=self.http_status,
                error=self.error,
                stash=self.stash if self.sse else None,
                parts=self.parts,
                t0=self.t0,
                last_t=self.last_t,
            )

    def mirror_pool(self) -> Upstream:
        return self.conn.server.upstream

    async def _ask(self) -> None:
        pool = self.mirror_pool()
        request = self._request_bytes(pool)
        for attempt in (0, 1):
            self.connecting = True
            try:
                up, reused = await pool.acquire()
            except TimeoutError as exc:
                self._answer_error(
                    504,
                    f"timeout: {exc!r}",
                    Status.TIMEOUT,
                    "the incumbent did not answer",
                    "GatewayTimeout",
                )
                return
            except OSError as exc:
                self._answer_error(
                    502,
                    repr(exc),
                    Status.CONNECTION_ERROR,
                    f"the incumbent is unreachable: {redact_urls(str(exc))}",
                    "BadGateway",
                )
                return
            finally:
                self.connecting = False
            self.up = up
            self.reused = reused
            self.last_read = self.clock()
            if self.conn.write_paused:
                up.pause()
            up.send(self, request)
            self._arm_timer()
            await self.fut
            if self.retry and attempt == 0:
                # a kept-alive connection the incumbent had closed: once more, on a new one
                self.retry = False
                self.up = None
                self.fut = self.conn.loop.create_future()
                continue
            return

    retry = False
    reused = False

    def _request_bytes(self, pool: Upstream) -> bytes:
        p = self.p
        out = [
            b"POST " + pool.prefix.encode("latin-1") + p.target + b" HTTP/1.1\r\nhost: ",
            pool.host_header,
            b"\r\n",
        ]
        for name, value in p.raw_headers:  # the client's own: never the mirror's credentials
            out.append(name + b": " + value + b"\r\n")
        out.append(b"content-length: %d\r\n\r\n" % len(p.body))
        out.append(p.body)
        return b"".join(out)

    def _arm_timer(self) -> None:
        read = self.conn.server.settings.incumbent.read_timeout_s
        if read is not None:
            self.timer = self.conn.loop.call_later(read, self._read_late)

    def _read_late(self) -> None:
        self.timer = None
        if self.fut.done():
            return
        read = self.conn.server.settings.incumbent.read_timeout_s
        assert read is not None
        idle = self.clock() - self.last_read
        if idle < read:
            self.timer = self.conn.loop.call_later(read - idle, self._read_late)
            return
        exc = TimeoutError(f"no byte from the incumbent in {read:g}s")
        if self.up is not None:
            self.up.close()
        if not self.started:
            self._answer_error(
                504,
                f"timeout: {exc!r}",
                Status.TIMEOUT,
                "the incumbent did not answer",
                "GatewayTimeout",
            )
        else:
            self.status, self.error = Status.TIMEOUT, f"timeout while reading: {exc!r}"
            self._release_hider()
            self.conn.close()
        self._resolve()

    def _answer_error(
        self, code: int, error: str, status: Status, message: str, err_type: str
    ) -> None:
        self.status, self.error, self.client_code = status, error, code
        self.conn.responded = True
        if not self.conn.closed:
            self.conn.transport.write(error_answer(code, message, err_type, self.pid))
        self.complete = True  # the client got its (error) answer
        self.keep_up = False
        self.conn.keep_alive = False

    def _resolve(self) -> None:
        if not self.fut.done():
            self.fut.set_result(None)

    # -- back-pressure and the client leaving -------------------------------------------------

    def pause(self) -> None:
        if self.up is not None:
            self.up.pause()

    def resume(self) -> None:
        if self.up is not None:
            self.up.resume()

    def client_gone(self, why: str = "the client disconnected") -> None:
        """The client disconnected (or was disconnected, ``why``) before its answer was
        complete: the incumbent's connection is closed (the engine stops) and the pair's shadow
        requests cancelled."""
        if self.complete or self.gone:
            return
        self.gone = True
        self.status, self.error = Status.CANCELLED, why
        if self.up is not None:
            self.up.close()
        for t in self.p.shadows:
            t.cancel()
        if self.connecting and self.task is not None:
            self.task.cancel()
        self._resolve()

    # -- the incumbent's answer (UpstreamConnection callbacks; never raise) -------------------

    def head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        t = self.clock()
        self.last_read = t
        self.http_status = self.client_code = status
        self.status = status_of(status)
        ctype = b""
        encoded = False
        for name, value in headers:
            low = name.lower()
            if low == b"content-type":
                ctype = value.split(b";", 1)[0].strip().lower()
            elif low == b"content-encoding":
                encoded = value.strip().lower() != b"identity"
        self.sse = ctype == b"text/event-stream" and not encoded
        rechunk = self.p.strip and self.sse
        out_headers = client_headers(
            headers, self.pid, rechunked=rechunk, drop=self.core.response_drop
        )
        out = [status_line(status)]
        length = False
        for name, value in out_headers:
            if name == b"content-length":
                length = True
            out.append(name + b": " + value + b"\r\n")
        self.bodiless = status in _NO_BODY or status < 200
        if not length and not self.bodiless:
            if self.http11:
                self.chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
            else:
                self.conn.keep_alive = False
        if not self.conn.keep_alive:
            out.append(b"connection: close\r\n")
        out.append(b"\r\n")
        self.hider = UsageHider() if rechunk else None
        self.started = True
        self.conn.responded = True
        if not self.conn.closed:
            self.conn.transport.write(b"".join(out))

    def body(self, data: bytes) -> None:
        t = self.clock()
        self.last_t = self.last_read = t
        chunk = data
        if self.sse:
            self.stash.append((t, data))
            if self.hider is not None:
                chunk = self.hider.feed(data, t)
        elif self.status is Status.OK or len(self.parts) < 64:
            self.parts.append(data)
        if chunk:
            self._write(chunk)
        if self.first:
            self.first = False
            m.ADDED.observe((self.t0 - self.p.t_ready) + (self.clock() - t))

    def _write(self, chunk: bytes) -> None:
        if self.conn.closed or self.bodiless:
            return
        transport = self.conn.transport
        if self.chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            transport.write(chunk)

    def done(self, keep_alive: bool) -> None:
        if self.gone:
            return
        self._release_hider()
        if self.chunked and not self.conn.closed:
            self.conn.transport.write(b"0\r\n\r\n")
        self.complete = True
        self.keep_up = keep_alive
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._resolve()

    def broken(self, exc: Exception) -> None:
        if self.gone or self.fut.done():
            return
        if not self.started:
            if self.reused and self.up is not None and not self.up.received and not self.retry_used:
                self.retry_used = True
                self.retry = True
                self.up = None
                self._resolve()
                return
            self._answer_error(
                502,
                repr(exc),
                Status.CONNECTION_ERROR,
                f"the incumbent is unreachable: {redact_urls(str(exc))}",
                "BadGateway",
            )
        else:
            self.status, self.error = Status.CONNECTION_ERROR, f"stream broke: {exc!r}"
            self._release_hider()
            self.conn.close()  # the client sees the answer cut, as from the incumbent
        self._resolve()

    retry_used = False

    def _release_hider(self) -> None:
        hider = self.hider
        if hider is None:
            return
        self.hider = None
        rest = hider.close(self.clock())
        if hider.held_s is not None:
            m.HELD.observe(hider.held_s)
        if rest:
            self._write(rest)


class ClientServer:
    """The client port: :meth:`listen` on a socket, :meth:`drain` to stop (see the module
    docstring)."""

    def __init__(
        self,
        settings: MirrorSettings,
        core: ExchangeCore,
        passthrough: Passthrough,
        *,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.settings = settings
        self.core = core
        self.passthrough = passthrough
        self.limits = settings.limits
        self.answers = limit_answers(self.limits)
        self.connections: set[ClientConnection] = set()
        self.body_bytes = 0
        """Request body bytes held across the connections (read, not yet answered)."""
        self.upstream = Upstream.to(settings.incumbent, keepalive_s=keepalive_s)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.Server | None = None

    def may_hold(self, n: int) -> bool:
        """Whether a body of ``n`` more bytes fits in ``limits.max_body_buffer_bytes`` now."""
        return self.body_bytes + n <= self.limits.max_body_buffer_bytes

    def hold(self, n: int) -> bool:
        """Count ``n`` more body bytes held; False (nothing counted) past the budget."""
        if not self.may_hold(n):
            return False
        self.body_bytes += n
        return True

    def release(self, n: int) -> None:
        self.body_bytes -= n

    async def listen(self, sock: socket.socket | None = None, host: str = "127.0.0.1") -> int:
        """Serve on ``sock`` (a bound listening socket; None: a free port on ``host``); the
        port served."""
        self.loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await self.loop.create_server(
                lambda: ClientConnection(self), sock=sock, backlog=2048
            )
        else:
            self._server = await self.loop.create_server(
                lambda: ClientConnection(self), host, 0, backlog=2048
            )
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def drain(self) -> None:
        """Stop accepting; close idle connections; let the answers in flight finish (up to
        ``drain_timeout_s``), then cut the rest; close the incumbent's pool."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + max(1.0, self.settings.drain_timeout_s)
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.transport.abort()
            conn._lose()
        await asyncio.sleep(0)
        self.upstream.close()


__all__ = ["ClientConnection", "ClientServer", "error_answer"]
