"""uvicorn's httptools protocol with the limits of :class:`mirror.limits.ServerLimits`: a
header size limit (431), a header deadline (408, or a silent close of a connection that sent
nothing), a body deadline (408), a send deadline (a client that takes none of its answer is
dropped) and a cap on open connections per server (503); the idle keep-alive timeout is
uvicorn's own ``timeout_keep_alive``.

Cost on the client's path: two attribute tests per chunk received and, per request, one sum
over the header list and one timer (the body deadline); one timer per connection, one more per
request only when its head does not arrive in one chunk, and one while the client's transport
buffer is full (the send deadline). ``bench/edge_limits.py`` measures it against the plain
protocol.

Errors: none (refusals are answers to the client, counted in
``shadow_ab_mirror_edge_rejections_total``).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mirror import metrics as m
from mirror.limits import (
    BODY_TIMEOUT,
    CONNECTION_CAP,
    HEADER_TIMEOUT,
    HEADER_TOO_LARGE,
    IDLE_CLOSED,
    ServerLimits,
    limit_answers,
)


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a request the limits refuse."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit, a header deadline and a cap on
    open connections (per server). Subclasses made by :func:`limited_protocol` set ``limits``."""

    limits: ClassVar[ServerLimits] = ServerLimits()
    _answers: ClassVar[dict[str, bytes]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests or reading a request's head
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._reject: str | None = None

    # -- connections --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            # Never tracked by the server: answered, then closed by a lingering close.
            self.transport = transport
            self._in_head = False
            m.EDGE_REJECTIONS.labels(reason=CONNECTION_CAP).inc()
            _linger(transport, self._answers[CONNECTION_CAP], self.loop)
            return
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_late)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_late(self) -> None:
        """The client took none of its answer for ``send_timeout_s``: dropped; the app sees
        the client gone (and cancels the engine's request)."""
        self._send_timer = None
        if self.transport.is_closing() or not self.flow.write_paused:
            return
        m.SEND_TIMEOUTS.inc()
        self.transport.abort()

    # -- reading ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head's bytes counted and our refusals answered.
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self._reject is None:
                raise
            self._refuse(self._reject)
            return
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head:  # a request's head is still incomplete
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(HEADER_TOO_LARGE)
            elif self._head_timer is None and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_late
                )

    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        if size > self.limits.max_header_bytes:
            self._reject = HEADER_TOO_LARGE
            raise _Rejected
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _body_late(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # uvicorn stopped reading (pipelining, a full buffer)
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)
            return
        self._refuse(BODY_TIMEOUT)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._head_bytes or self.cycle is not None:
            self._refuse(HEADER_TIMEOUT)
        else:  # a connection that never sent a byte: closed without an answer (as nginx)
            m.EDGE_REJECTIONS.labels(reason=IDLE_CLOSED).inc()
            self.transport.close()

    def _refuse(self, reason: str) -> None:
        """Answer ``reason``'s refusal and hand the connection to a lingering close; this
        protocol lets go of it as if it were lost."""
        self._cancel_timers()
        self._in_head = False
        m.EDGE_REJECTIONS.labels(reason=reason).inc()
        transport = self.transport
        if transport.is_closing():
            return
        self.connections.discard(self)
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        _linger(transport, self._answers[reason], self.loop)


LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024


class _Lingering(asyncio.Protocol):
    """A refused connection after its answer: what the client still sends is read and
    discarded for up to :data:`LINGER_S` seconds or :data:`LINGER_BYTES` bytes, then the
    connection is closed (nginx's lingering close). Closing at once would make the kernel
    answer the client's next bytes with a reset, which can destroy the answer unread."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.left = LINGER_BYTES
        self.timer = loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        self.left -= len(data)
        if self.left < 0:
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()


def _linger(transport: asyncio.Transport, answer: bytes, loop: asyncio.AbstractEventLoop) -> None:
    transport.write(answer)
    if transport.can_write_eof():
        transport.write_eof()
    transport.set_protocol(_Lingering(transport, loop))
    transport.resume_reading()


def limited_protocol(limits: ServerLimits) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that enforces ``limits``
    (``idle_timeout_s`` goes to uvicorn's own ``timeout_keep_alive``)."""
    return type(
        "MirrorHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"limits": limits, "_answers": limit_answers(limits)},
    )


def uvicorn_limits(limits: ServerLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that apply ``limits``."""
    return {"http": limited_protocol(limits), "timeout_keep_alive": limits.idle_timeout_s}
