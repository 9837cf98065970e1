"""Every client request but a generate one: the pass-through allow-list and the refusals.

:meth:`Passthrough.answer` takes a request the client server (:mod:`mirror.server`) does not
handle itself: its path made canonical (:func:`mirror.routes.canonical_path`); an allowed route
(``routes``, default ``GET /v1/models[/*]``, ``/health``, ``/version``) is passed to the
incumbent on this module's aiohttp session and its answer streamed back (not shadowed, not
recorded); anything else is answered by the mirror: 400 (a path with control characters), 404,
405 (with ``Allow``), each a problem+json body counted in
``shadow_ab_mirror_edge_rejections_total``. The interface is ASGI-shaped (``scope``,
``receive``, ``send``); the client server adapts it to its connection.

The same session serves the mirror's own requests to the incumbent (the probes' model lookup),
with the incumbent URL's credentials; a client's request gets only the client's own.

Errors: none raised; 502 when the incumbent is unreachable, 413 for a body over
``max_body_bytes``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp

from mirror import metrics as m
from mirror.config import MirrorSettings
from mirror.headers import (
    PAIR_HEADER,
    client_headers,
    header_value,
    str_headers,
    upstream_headers,
)
from mirror.problem import PROBLEM_JSON, problem_body
from mirror.routes import Router, canonical_path, quoted
from mirror.upstream import CONNECT_TIMEOUT_S, KEEPALIVE_S
from shadow_ab.privacy import redact_urls

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SKIP_AUTO_HEADERS = ("Accept-Encoding", "User-Agent", "Content-Type")
"""aiohttp adds these when absent; the incumbent must see exactly the client's."""


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


def _path_qs(scope: Scope, path: str) -> str:
    """The canonical ``path`` as sent to the incumbent, with the client's query string."""
    qs = scope.get("query_string") or b""
    return f"{path}?{qs.decode('latin-1')}" if qs else path


class Passthrough:
    """The non-generate requests of one mirror (see the module docstring)."""

    def __init__(self, settings: MirrorSettings, response_drop: frozenset[bytes]) -> None:
        self.settings = settings
        self.inc_url = settings.incumbent.bare_url  # a client's request: not the URL's credentials
        self.router = Router(settings.routes)
        self.response_drop = response_drop
        self.session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Open the session to the incumbent (at the mirror's start)."""
        cfg = self.settings.incumbent
        read = getattr(cfg, "read_timeout_s", None)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0,
                ttl_dns_cache=300,
                keepalive_timeout=KEEPALIVE_S,
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )
        self.session = session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request that is not a generate one (ASGI-shaped ``scope``, ``receive``,
        ``send``): made canonical, then the pass-through allow-list, or 400/404/405
        (mirror/routes.py). Never raises for anything a client or the incumbent sends."""
        method = scope["method"]
        path = canonical_path(scope["path"])
        if path is None:
            await self._refuse(send, 400, "the path holds control characters", "bad_path")
            return
        allowed = self.router.methods(path)
        if method in allowed:
            await self._pass(scope, receive, send, path)
            return
        if allowed:
            allow = ", ".join(sorted(allowed))
            await self._refuse(
                send,
                405,
                f"{method[:16]} is not allowed on {path[:200]} (allowed: {allow})",
                "method_not_allowed",
                ((b"allow", allow.encode()),),
            )
            return
        await self._refuse(
            send,
            404,
            f"{path[:200]} is not a route of this server: the mirror passes on"
            " POST /v1/chat/completions, POST /v1/completions and the `routes` it is"
            " configured with",
            "route_not_allowed",
        )

    async def _refuse(
        self,
        send: Send,
        status: int,
        detail: str,
        reason: str,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        body = problem_body(status, detail)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", PROBLEM_JSON),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
        m.EDGE_REJECTIONS.labels(reason=reason).inc()

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.settings.max_body_bytes
        declared = header_value(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _TooLarge
        chunks = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _ClientGone
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise _TooLarge
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _send_error(
        self, send: Send, status: int, message: str, err_type: str, pair_id: bytes = b""
    ) -> None:
        body = problem_body(status, message, err_type)
        headers = [
            (b"content-type", PROBLEM_JSON),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if pair_id:
            headers.append((PAIR_HEADER, pair_id))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _too_large(self, send: Send, route: str) -> None:
        limit = self.settings.max_body_bytes
        msg = f"request body is larger than the mirror's limit of {limit} bytes (max_body_bytes)"
        await self._send_error(send, 413, msg, "RequestTooLarge")
        m.REQUESTS.labels(route=route, code="413").inc()

    async def _pass(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """An allowed route (canonical ``path``): the incumbent's answer, streamed, not
        shadowed, not recorded."""
        session = self.session
        assert session is not None, "the pass-through has not started"
        route = "passthrough"
        try:
            body = await self._read_body(scope, receive)
        except _TooLarge:
            await self._too_large(send, route)
            return
        except _ClientGone:
            return
        headers = [(n, v) for n, v in upstream_headers(scope["headers"], b"") if n != PAIR_HEADER]
        try:
            resp = await session.request(
                scope["method"],
                self.inc_url + _path_qs(scope, quoted(path)),
                data=body or None,
                headers=str_headers(headers),
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            await self._send_error(
                send, 502, f"the incumbent is unreachable: {redact_urls(str(exc))}", "BadGateway"
            )
            m.REQUESTS.labels(route=route, code="502").inc()
            return
        try:
            out_headers = [
                (n, v)
                for n, v in client_headers(
                    resp.raw_headers, b"", rechunked=False, drop=self.response_drop
                )
                if n != PAIR_HEADER
            ]
            await send(
                {"type": "http.response.start", "status": resp.status, "headers": out_headers}
            )
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            m.REQUESTS.labels(route=route, code=str(resp.status)).inc()
        except aiohttp.ClientError:
            log.warning("pass-through %s broke mid-answer", scope["path"])
        finally:
            resp.release()
