"""The mirror's serving path: the incumbent's answer to the client, a shadow copy to the candidate.

:func:`create_app` returns :class:`Mirror`, a raw ASGI callable (run by uvicorn with uvloop and
httptools). It dispatches on the request path before any framework routing, because every
microsecond on the client's path counts (docs/architecture.md, "Promises"):

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: the hot path. The body is read
  (up to ``max_body_bytes``, else 413), a pair id is assigned, the shadow decision taken
  (sampling, guard, cap), the shadow requests fired as tasks (:mod:`mirror.shadow`), and only
  then is the incumbent asked. Its status, headers and bytes go to the client as they arrive,
  plus ``x-shadow-pair-id``. The client's path never awaits a shadow request: this module only
  fires them (:meth:`mirror.shadow.Shadows.fire`) and awaits nothing else of
  :mod:`mirror.shadow` but the drain at shutdown.
- the pass-through allow-list (``routes``: ``/v1/models``, ``/health``, ``/version`` by
  default): passed through to the incumbent, not shadowed, not recorded;
- everything else: 404 (405 for a known path with another method, TRACE included), answered
  by the mirror without reaching an engine (:mod:`mirror.routes`). Paths are made canonical
  first (``//v1/chat/./completions`` is ``/v1/chat/completions``), and the engines get the
  canonical path.

The mirror's own endpoints (``/metrics``, ``/healthz``, ``/mirror/docs``) are a small FastAPI
application (:mod:`mirror.admin`, :attr:`Mirror.admin`) served on the admin port, never on the
client port; it also runs the lifespan (sessions, health sampler, draining).

Each engine answer becomes one :class:`~shadow_ab.records.ExchangeRecord` (roles ``incumbent``,
``candidate``, ``replay``) handed to the sink after the client's answer is complete (shadow
records when the shadow request ends). A client that disconnects cancels the incumbent request
and the pair's shadow requests; they are recorded as ``cancelled``.

Errors the client can get from the mirror itself (everything else is the incumbent's), each a
problem+json body with an OpenAI-style ``error`` member (:mod:`mirror.problem`): 400 (a path
with control characters), 404/405 (not an allowed route), 413 (body over ``max_body_bytes``),
502 (the incumbent refused the connection), 504 (the incumbent's read timeout, when
configured); and from the connection limits (:mod:`mirror.protocol`) 408, 431 and 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import yarl

from mirror import metrics as m
from mirror.admin import admin_app
from mirror.config import MirrorSettings
from mirror.guard import InterferenceGuard
from mirror.headers import (
    PAIR_HEADER,
    RESPONSE_DROP,
    candidate_headers,
    client_headers,
    header_value,
    shadow_headers,
    upstream_headers,
)
from mirror.overload import LoopLag
from mirror.privacy import Privacy, RedactionError
from mirror.problem import PROBLEM_JSON, problem_body
from mirror.recording import ERROR_BODY_KEEP, Dispatch, build_record, error_text
from mirror.rewrite import (
    INCLUDE_USAGE,
    ask_top_logprobs,
    candidate_request,
    replay_request,
    stored_request,
    with_stream_usage,
)
from mirror.routes import Router, canonical_path, quoted
from mirror.sampling import Sampler
from mirror.shadow import Shadows
from mirror.sinks import sink_alive
from mirror.trace import Outcome, StreamTrace, parse_body, stream_trace
from shadow_ab.gc_tuning import tune_for_serving
from shadow_ab.privacy import redact_url, redact_urls
from shadow_ab.records import Endpoint, ExchangeRecord, Role, Status, utcnow

if TYPE_CHECKING:
    from mirror.sinks import RecordSink

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROUTES: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint.CHAT,
    "/v1/completions": Endpoint.COMPLETIONS,
}
SKIP_AUTO_HEADERS = ("Accept-Encoding", "User-Agent", "Content-Type")
"""aiohttp adds these when absent; the engines must see exactly the client's. Sessions handed
to :func:`create_app` should be made with ``skip_auto_headers=SKIP_AUTO_HEADERS`` too."""

# Shadow decisions (label values of shadow_ab_mirror_shadow_decisions_total).
SAMPLED = "sampled"
SKIPPED_SAMPLE = "skipped_sample"
SKIPPED_CAP = "skipped_cap"
SKIPPED_GUARD = "skipped_guard"
SKIPPED_MALFORMED = "skipped_malformed"
SKIPPED_TOO_LARGE = "skipped_too_large"
SKIPPED_LOAD_PARITY = "skipped_load_parity"
SKIPPED_OVERLOAD = "skipped_overload"
DECISIONS = (
    SAMPLED,
    SKIPPED_SAMPLE,
    SKIPPED_CAP,
    SKIPPED_GUARD,
    SKIPPED_MALFORMED,
    SKIPPED_TOO_LARGE,
    SKIPPED_LOAD_PARITY,
    SKIPPED_OVERLOAD,
)


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class Prepared:
    """A generate request made ready for the incumbent (:meth:`Mirror._prepare`): the URL,
    the record stub, the body and headers it gets, and the shadow tasks already fired."""

    __slots__ = (
        "body",
        "chat",
        "d",
        "raw_headers",
        "shadow_active",
        "shadows",
        "strip",
        "t_ready",
        "url",
    )

    def __init__(
        self,
        *,
        url: yarl.URL,
        d: Dispatch,
        body: bytes,
        raw_headers: list[tuple[bytes, bytes]],
        strip: bool,
        chat: bool,
        t_ready: float,
        shadow_active: bool,
        shadows: list[asyncio.Task[None]],
    ) -> None:
        self.url = url
        self.d = d
        self.body = body
        self.raw_headers = raw_headers
        self.strip = strip
        self.chat = chat
        self.t_ready = t_ready
        self.shadow_active = shadow_active
        self.shadows = shadows


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _str_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers]


def _error_json(status: int, message: str, err_type: str) -> bytes:
    return problem_body(status, message, err_type)


GC_THRESHOLD = (10_000, 20, 20)
"""Collector thresholds while serving (default 700, 10, 10): a request makes hundreds of
short-lived objects, and the default gen-0 threshold ran a collection every few requests."""


def _tune_gc() -> None:
    """Move everything alive after start-up (modules, settings, pydantic and SQLAlchemy
    machinery) out of the collector's sight, and collect less often: the collector was ~6% of
    the mirror's CPU under load (py-spy --native)."""
    tune_for_serving(*GC_THRESHOLD)


def _path_qs(scope: Scope, path: str) -> str:
    """The canonical ``path`` as sent to an engine, with the client's query string."""
    qs = scope.get("query_string") or b""
    return f"{path}?{qs.decode('latin-1')}" if qs else path


class Mirror:
    """The mirror as an ASGI application (see the module docstring)."""

    def __init__(
        self,
        settings: MirrorSettings,
        *,
        sink: RecordSink,
        incumbent_session: aiohttp.ClientSession | None = None,
        candidate_session: aiohttp.ClientSession | None = None,
        guard: InterferenceGuard | None = None,
        sampler: Sampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.incumbent_session = incumbent_session
        self.candidate_session = candidate_session
        self.guard = guard or InterferenceGuard(settings.guard)
        self.loop_lag = LoopLag(settings.overload)
        self.sampler = sampler or Sampler(settings.shadow)
        self._clock = clock
        self._wall = wall
        self._own_sessions: list[aiohttp.ClientSession] = []
        self._health_session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self.inc_url = settings.incumbent.url
        self.cand_url = settings.candidate.url
        self.inc_engine = settings.incumbent_engine()
        self.cand_engine = settings.candidate_engine()
        self.deployment = settings.deployment
        self._cand_extra = settings.candidate.own_headers("candidate")
        self._inc_own = settings.incumbent.own_headers("incumbent")
        """The incumbent's own headers, for the mirror's own requests to it (probes)."""
        self._cand_forward = frozenset(settings.candidate.forward_headers)
        self.privacy = Privacy(settings.privacy)
        self._inflight = {Role.INCUMBENT: 0, Role.CANDIDATE: 0, Role.REPLAY: 0}
        self.shadows = Shadows(self)
        self.draining = False
        self._sink_label = sink.label
        # Metric children looked up once (labels() costs microseconds per call).
        self._m_decision = {d: m.SHADOW_DECISIONS.labels(decision=d) for d in DECISIONS}
        self._m_inflight = {r: m.INFLIGHT.labels(role=r.value) for r in Role}
        self._m_ttft = {r: m.TTFT.labels(role=r.value) for r in Role}
        self._m_e2e = {r: m.E2E.labels(role=r.value) for r in Role}
        self._m_upstream = {
            (r, s): m.UPSTREAM_REQUESTS.labels(role=r.value, status=s.value)
            for r in Role
            for s in Status
        }
        self._m_records = m.RECORDS.labels(sink=self._sink_label, kind="exchange")
        self._m_requests_cache: dict[tuple[str, int], Any] = {}
        self._urls: dict[str, yarl.URL] = {}
        self.admin = admin_app(self)
        self.started = False
        self.router = Router(settings.routes)
        hidden = {h.encode("latin-1") for h in settings.hide_response_headers}
        self._response_drop = RESPONSE_DROP | hidden

    def _m_requests(self, route: str, code: int) -> Any:
        """The ``shadow_ab_mirror_requests_total`` child of a hot route and status (looked up
        once: ``labels()`` costs microseconds per call)."""
        child = self._m_requests_cache.get((route, code))
        if child is None:
            child = m.REQUESTS.labels(route=route, code=str(code))
            if len(self._m_requests_cache) < 1024:
                self._m_requests_cache[(route, code)] = child
        return child

    def _url(self, base: str, path_qs: str) -> yarl.URL:
        """An engine URL, parsed once per engine and path (aiohttp parses a str per request);
        paths with a query string are not kept."""
        key = base + path_qs
        url = self._urls.get(key)
        if url is None:
            url = yarl.URL(key)
            if "?" not in path_qs and len(self._urls) < 64:
                self._urls[key] = url
        return url

    # -- routing (every request but a generate one) --------------------------------------

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every request but a generate one (the client server takes those, canonical or
        not): made canonical, then the pass-through allow-list, or 400/404/405
        (mirror/routes.py)."""
        method = scope["method"]
        path = canonical_path(scope["path"])
        if path is None:
            await self._refuse(send, 400, "the path holds control characters", "bad_path")
            return
        allowed = self.router.methods(path)
        if method in allowed:
            await self._passthrough(scope, receive, send, path)
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

    # -- lifecycle --------------------------------------------------------------------------

    async def startup(self) -> None:
        if self.incumbent_session is None:
            self.incumbent_session = self._session(self.settings.incumbent, raw=True)
        self.shadows.start()  # the shadow requests' own connection pools (mirror/shadow.py)
        self.loop_lag.start()
        if self.settings.health_enabled:
            self._start_health()
        if self.settings.probes.per_minute > 0:
            from mirror.probes import ProbeInjector

            injector = ProbeInjector(self, self.settings.probes)
            self._probe_task = asyncio.create_task(injector.run(), name="probes")
        _tune_gc()
        self.started = True
        log.info(
            "mirroring %s (incumbent) to %s (candidate), shadow rate %.3g, deployment %s",
            redact_url(self.inc_url),
            redact_url(self.cand_url),
            self.settings.shadow.rate,
            self.deployment,
        )

    def _session(self, cfg: Any, *, raw: bool) -> aiohttp.ClientSession:
        read = getattr(cfg, "read_timeout_s", None)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=cfg.max_connections,
                ttl_dns_cache=300,
                keepalive_timeout=cfg.keepalive_timeout_s,
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.connect_timeout_s, sock_read=read
            ),
            auto_decompress=not raw,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=SKIP_AUTO_HEADERS,
        )
        self._own_sessions.append(session)
        return session

    def _start_health(self) -> None:
        from mirror.health import EngineTarget, HealthSampler

        s = self.settings
        targets = [
            EngineTarget(self.inc_engine, Role.INCUMBENT, self.inc_url, s.incumbent.flavor),
            EngineTarget(self.cand_engine, Role.CANDIDATE, self.cand_url, s.candidate.flavor),
        ]
        self._health_session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        sampler = HealthSampler(targets, self.sink, self._health_session, self.deployment, s.health)
        self._health_task = asyncio.create_task(sampler.run(), name="health-sampler")

    async def shutdown(self) -> None:
        """Let shadow requests finish (up to ``drain_timeout_s``; the rest are recorded as
        cancelled), stop the health sampler, close sessions, flush the sink."""
        self.draining = True
        self.loop_lag.stop()
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        await self.shadows.drain(self.settings.drain_timeout_s)
        self.shadows.close()
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        for session in [*self._own_sessions, self._health_session]:
            if session is not None:
                await session.close()
        self._own_sessions.clear()
        timeout = self.settings.sink_close_timeout_s
        flushed = await asyncio.to_thread(self.sink.flush, timeout)
        if not flushed:
            log.warning("the sink did not deliver every record within %.0fs", timeout)

    def health(self) -> dict[str, Any]:
        sink_ok = sink_alive(self.sink)
        return {
            "status": "draining"
            if self.draining
            else "sink_dead"
            if not sink_ok
            else "ok"
            if self.started
            else "starting",
            "sink": "ok" if sink_ok else "dead",
            "deployment": self.deployment,
            "inflight": {r.value: n for r, n in self._inflight.items()},
            "shadow_inflight": self.shadows.inflight,
            "guard": self.guard.state(),
        }

    # -- request body -------------------------------------------------------------------------

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
        body = _error_json(status, message, err_type)
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

    # -- the hot path -------------------------------------------------------------------------

    def _prepare(
        self,
        scope: Scope,
        body: bytes,
        endpoint: Endpoint,
        route: str,
    ) -> Prepared:
        """Everything of a generate request before the incumbent is asked: the pair id, the
        shadow decision (counted), the shadow requests fired, the incumbent's body, headers and
        record stub (:class:`Prepared`)."""
        t_ready = self._clock()
        pair = uuid.uuid4()
        pid = str(pair).encode()
        parsed = _json_object(body)
        chat = endpoint is Endpoint.CHAT

        # The shadow decision: never queued, counted either way.
        if parsed is None:
            decision = SKIPPED_MALFORMED
        else:
            sampler = self.sampler
            hv = header_value(scope["headers"], sampler.header) if sampler.header else None
            u = sampler.draw(hv)
            if not sampler.sampled(u):
                decision = SKIPPED_SAMPLE
            elif not self.guard.admit(g := sampler.guard_draw(u)):
                decision = SKIPPED_GUARD
            elif not self.loop_lag.admit(g):
                decision = SKIPPED_OVERLOAD
            elif self.shadows.inflight >= self.settings.shadow.max_concurrent:
                decision = SKIPPED_CAP
            elif not self.settings.shadow.parity_allows(
                self._inflight[Role.CANDIDATE], self._inflight[Role.INCUMBENT]
            ):
                decision = SKIPPED_LOAD_PARITY
            else:
                decision = SAMPLED
        self._m_decision[decision].inc()
        privacy = self.privacy
        capture = privacy.level_for(header_value(scope["headers"], privacy.header))

        up_headers = upstream_headers(scope["headers"], pid)
        inc_body = body
        strip = False
        inc_rewrites: list[str] = []
        inc_request = parsed
        if parsed is not None and self.settings.incumbent.include_usage:
            usage_body = with_stream_usage(parsed)
            if usage_body is not None:
                inc_body = orjson.dumps(usage_body)
                inc_request = usage_body
                strip = True
                inc_rewrites = [INCLUDE_USAGE]
        stream = parsed is not None and parsed.get("stream") is True
        guard_state = self.guard.state()
        guard_state["decision"] = decision  # why the pair was (not) shadowed, in its records
        inflight_inc = self._inflight[Role.INCUMBENT] + self._inflight[Role.REPLAY]
        inflight_cand = self._inflight[Role.CANDIDATE]

        shadows: list[asyncio.Task[None]] = []
        if decision == SAMPLED:
            assert parsed is not None
            sh_headers = _str_headers(shadow_headers(up_headers))
            cand_headers = candidate_headers(sh_headers, self._cand_forward, self._cand_extra)
            cand_body, cand_rewrites = candidate_request(
                parsed, chat=chat, rewrite=self.settings.candidate.rewrite
            )
            cand_body, cand_rewrites = ask_top_logprobs(
                cand_body, cand_rewrites, chat=chat, k=self.settings.shadow.top_logprobs
            )
            common = {
                "pair_id": pair,
                "endpoint": endpoint,
                "stream": stream,
                "inflight_incumbent": inflight_inc,
                "inflight_candidate": inflight_cand,
                "guard": guard_state,
                "capture": capture,
            }
            shadows.append(
                self.shadows.fire(
                    Role.CANDIDATE, route, cand_body, cand_rewrites, cand_headers, common
                )
            )
            if (
                self.sampler.replay()
                and self.shadows.inflight < self.settings.shadow.max_concurrent
            ):
                m.REPLAYS.inc()
                sc = self.settings.shadow
                replay_body, replay_rewrites = replay_request(
                    inc_request if inc_request is not None else parsed,
                    inc_rewrites,
                    chat=chat,
                    top_logprobs=sc.top_logprobs,
                    delay_s=sc.replay_delay_s,
                    pool=sc.replay_pool,
                    cache_salt=uuid.uuid4().hex if sc.replay_cache_salt else None,
                )
                shadows.append(
                    self.shadows.fire(
                        Role.REPLAY, route, replay_body, replay_rewrites, sh_headers, common
                    )
                )

        d = Dispatch(
            pair_id=pair,
            role=Role.INCUMBENT,
            engine=self.inc_engine,
            endpoint=endpoint,
            stream=stream,
            sent_at=self._wall(),
            request=stored_request(inc_request) if inc_request is not None else {},
            rewrites=inc_rewrites,
            inflight_incumbent=inflight_inc,
            inflight_candidate=inflight_cand,
            guard=guard_state,
            capture=capture,
        )
        return Prepared(
            url=self._url(self.inc_url, _path_qs(scope, route)),
            d=d,
            body=inc_body,
            raw_headers=up_headers,
            strip=strip,
            chat=chat,
            t_ready=t_ready,
            shadow_active=self.shadows.inflight > 0,
            shadows=shadows,
        )

    def _settle(
        self,
        d: Dispatch,
        *,
        route: str,
        client_code: int,
        status: Status,
        http_status: int | None,
        error: str | None,
        stash: list[tuple[float, bytes]] | None,
        parts: list[bytes],
        chat: bool,
        t0: float,
        last_t: float | None,
        shadow_active: bool,
    ) -> None:
        """The end of an incumbent exchange, on either data plane (after the client's answer
        is complete): in-flight count and request metric, the stream parsed into its record
        (``stash``: an SSE stream's chunks with their arrival times), the guard fed, the
        record handed to the sink."""
        role = d.role
        self._inflight[role] -= 1
        self._m_inflight[role].dec()
        self._m_requests(route, client_code or 499).inc()
        trace = stream_trace(stash, t0, chat=chat) if stash is not None else None
        outcome = self._outcome(trace, parts, chat, t0, last_t, status)
        if status is Status.HTTP_ERROR and parts:
            error = error_text(b"".join(parts)[:ERROR_BODY_KEEP])
        if status is Status.OK:
            self.guard.observe(outcome.ttft_s, outcome.e2e_s, shadow_active)
        self._finish(d, status, outcome, http_status, error)

    def _outcome(
        self,
        trace: StreamTrace | None,
        parts: list[bytes],
        chat: bool,
        t0: float,
        last_t: float | None,
        status: Status,
    ) -> Outcome:
        if trace is not None:
            return trace.outcome()
        if status is Status.OK and last_t is not None:
            return parse_body(b"".join(parts), chat=chat, e2e_s=last_t - t0)
        return Outcome(e2e_s=max(0.0, last_t - t0) if last_t is not None else None)

    def _finish(
        self,
        d: Dispatch,
        status: Status,
        outcome: Outcome,
        http_status: int | None,
        error: str | None,
    ) -> None:
        """Count the exchange and hand its record to the sink (never raises)."""
        role = d.role
        self._m_upstream[(role, status)].inc()
        if outcome.ttft_s is not None:
            self._m_ttft[role].observe(outcome.ttft_s)
        if outcome.e2e_s is not None and status is Status.OK:
            self._m_e2e[role].observe(outcome.e2e_s)
        try:
            record: ExchangeRecord = build_record(
                self.deployment,
                d,
                status=status,
                outcome=outcome,
                http_status=http_status,
                error=error,
            )
        except Exception:
            log.exception("could not build the %s record of pair %s", role.value, d.pair_id)
            m.RECORDS_DROPPED.labels(reason="encode_error").inc()
            return
        try:
            if d.synthetic is None:  # a probe's text is the mirror's own, not a client's
                record = self.privacy.apply(record, d.capture)
        except RedactionError as exc:
            log.error(
                "the redactor failed on the %s record of pair %s: %s", role.value, d.pair_id, exc
            )
            m.RECORDS_DROPPED.labels(reason="redactor_error").inc()
            return
        try:
            accepted = self.sink.submit(record)
        except Exception:
            log.exception("the sink refused a record")
            accepted = False
        if accepted:
            if self._sink_label == "direct":
                self._m_records.inc()
        elif self._sink_label == "direct":
            m.RECORDS_DROPPED.labels(reason="sink_refused").inc()

    # -- pass-through -------------------------------------------------------------------------

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """An allowed route (canonical ``path``): the incumbent's answer, streamed, not
        shadowed, not recorded."""
        session = self.incumbent_session
        assert session is not None, "the mirror's lifespan has not started"
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
                headers=_str_headers(headers),
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
                    resp.raw_headers, b"", rechunked=False, drop=self._response_drop
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


def create_app(
    settings: MirrorSettings,
    *,
    sink: RecordSink,
    incumbent_session: aiohttp.ClientSession | None = None,
    candidate_session: aiohttp.ClientSession | None = None,
) -> Mirror:
    """The mirror's ASGI application; sessions not given are made (and closed) by its lifespan."""
    return Mirror(
        settings,
        sink=sink,
        incumbent_session=incumbent_session,
        candidate_session=candidate_session,
    )
