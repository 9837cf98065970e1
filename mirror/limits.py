"""Limits of the mirror's listening sockets: what one client connection may cost the mirror.

An HTTP server that reads headers without a limit or a deadline, and accepts connections
without a cap, lets a few clients take all its memory (issue 14: one connection sending 200 MB
of headers took the mirror from 109 to 317 MB; 1,000 idle and 200 slow-header connections all
stayed open). :class:`ServerLimits` holds the seven limits a reverse proxy sets, with nginx's
and Envoy's defaults in mind (the last one bounds what all connections hold together: without
it 4,096 connections each holding most of an 8 MiB body are 32 GiB):

| limit | default | nginx | Envoy | beyond it |
|---|---|---|---|---|
| ``max_header_bytes`` | 64 KiB | ``large_client_header_buffers`` 4x8k | ``max_request_headers_kb`` 60 | 431, closed |
| ``header_timeout_s`` | 60 s | ``client_header_timeout`` 60s | ``request_headers_timeout`` | 408, closed (a connection that sent nothing is closed silently, as nginx does) |
| ``body_timeout_s`` | 60 s | ``client_body_timeout`` 60s (between reads) | ``request_timeout`` (whole request) | 408, closed |
| ``send_timeout_s`` | 60 s | ``send_timeout`` 60s | ``stream_idle_timeout`` 5m | closed; the engine's request is cancelled |
| ``idle_timeout_s`` | 75 s | ``keepalive_timeout`` 75s | ``idle_timeout`` 1h | closed |
| ``max_connections`` | 4096 | ``worker_connections`` | overload manager | 503, closed |
| ``max_body_buffer_bytes`` | 256 MiB | ``client_body_buffer_size`` (then a temp file) | ``per_connection_buffer_limit_bytes`` | 503, closed |

The client server (:mod:`mirror.wire`) enforces them; this module holds the limits, their
answers (:func:`limit_answers`) and the lingering close after a refusal (:func:`linger`).

Errors: none (settings errors are :class:`pydantic.ValidationError`, explained by
:mod:`mirror.config`).
"""  # noqa: E501 (a table reads better unwrapped)

from __future__ import annotations

import asyncio
import http

from pydantic import BaseModel, ConfigDict, Field

from mirror.problem import problem_body


class ServerLimits(BaseModel):
    """Limits of each client connection (``limits:`` in the mirror's settings)."""

    model_config = ConfigDict(extra="forbid")

    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="request line plus headers; larger requests get 431 and are closed",
    )
    header_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="a request's headers must arrive within this time (from the connection or"
        " the request's first byte), else 408 and closed",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="a request's body must arrive whole within this time after its headers,"
        " else 408 and closed (a client trickling a body holds no connection for ever)",
    )
    send_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="a client that takes none of its answer's bytes for this long is"
        " disconnected, and the engine's request cancelled (it holds no engine slot for ever)",
    )
    idle_timeout_s: float = Field(
        default=75.0,
        gt=0,
        le=86400,
        description="a keep-alive connection without a request for this long is closed",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="open client connections; more are answered 503 and closed",
    )
    max_body_buffer_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="request body bytes held at once across all connections (read and not yet"
        " answered); a request whose body would pass it gets 503 and is closed (at least"
        " max_body_bytes)",
    )


# Label values of shadow_ab_mirror_edge_rejections_total.
CONNECTION_CAP = "connection_cap"
HEADER_TOO_LARGE = "header_too_large"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
BODY_BUDGET = "body_budget"
IDLE_CLOSED = "header_timeout_idle"


def reject_bytes(status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, with a problem+json body that also
    carries an OpenAI-style ``error`` member (what OpenAI SDKs read)."""
    body = problem_body(status, detail)
    phrase = http.HTTPStatus(status).phrase
    head = [
        f"HTTP/1.1 {status} {phrase}\r\n".encode(),
        b"content-type: application/problem+json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n",
    ]
    head += [n + b": " + v + b"\r\n" for n, v in headers]
    return b"".join(head) + b"\r\n" + body


def limit_answers(limits: ServerLimits) -> dict[str, bytes]:
    """The whole answer sent for each refusal reason (built once)."""
    return {
        CONNECTION_CAP: reject_bytes(
            503,
            f"the mirror has {limits.max_connections} client connections open"
            " (limits.max_connections): retry shortly, or reuse connections",
            ((b"retry-after", b"1"),),
        ),
        HEADER_TOO_LARGE: reject_bytes(
            431,
            f"the request line and headers exceed {limits.max_header_bytes} bytes"
            " (limits.max_header_bytes): send fewer or smaller headers",
        ),
        HEADER_TIMEOUT: reject_bytes(
            408,
            f"the request's headers did not arrive within {limits.header_timeout_s:g}s"
            " (limits.header_timeout_s): send the whole head at once",
        ),
        BODY_BUDGET: reject_bytes(
            503,
            f"the mirror holds {limits.max_body_buffer_bytes} bytes of request bodies across its"
            " connections (limits.max_body_buffer_bytes): retry shortly",
            ((b"retry-after", b"1"),),
        ),
        BODY_TIMEOUT: reject_bytes(
            408,
            f"the request's body did not arrive within {limits.body_timeout_s:g}s of its headers"
            " (limits.body_timeout_s): send the whole body at once",
        ),
    }


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


def linger(transport: asyncio.Transport, answer: bytes, loop: asyncio.AbstractEventLoop) -> None:
    """Write ``answer`` (a refusal), then close ``transport`` lingering (:class:`_Lingering`)."""
    transport.write(answer)
    if transport.can_write_eof():
        transport.write_eof()
    transport.set_protocol(_Lingering(transport, loop))
    transport.resume_reading()
