"""The exchange core: a generate request's steps before and after the incumbent is asked.

The client server (:mod:`mirror.server`) owns the bytes; this module owns what a generate
request means, through two public calls:

- :meth:`ExchangeCore.prepare`, once the request's body is read: a pair id; the body sized up
  before it is parsed (:func:`mirror.body.inspect_body`: a body past the bounds on JSON work,
  or not JSON, goes to the incumbent unchanged and is not shadowed); the shadow decision
  (sampling, the interference guard, the mirror's own overload, the shadow cap, load
  parity), counted in ``shadow_ab_mirror_shadow_decisions_total``; the candidate's and the
  replay's requests fired as tasks (:meth:`mirror.shadow.Shadows.fire`, never awaited); the
  incumbent's body (``stream_options.include_usage`` added when asked) and headers; the
  record stub. It returns a :class:`Prepared`.
- :meth:`ExchangeCore.settle`, once the client's answer is complete or cut: the request
  counted, the kept chunks parsed into timings and text (:func:`mirror.trace.stream_trace`),
  the guard fed, the record handed to the sink through the :class:`~mirror.recorder.Recorder`.

Nothing here touches a socket or awaits: both calls take microseconds and never raise for
anything a client or an engine sends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

from mirror import metrics as m
from mirror.asks import client_asks_logprobs
from mirror.body import MALFORMED, inspect_body
from mirror.config import MirrorSettings
from mirror.guard import InterferenceGuard
from mirror.headers import (
    RESPONSE_DROP,
    candidate_headers,
    header_value,
    shadow_headers,
    str_headers,
    upstream_headers,
)
from mirror.overload import LoopLag
from mirror.recorder import Recorder
from mirror.recording import ERROR_BODY_KEEP, Dispatch, error_text
from mirror.rewrite import (
    INCLUDE_USAGE,
    LOGPROBS,
    ask_top_logprobs,
    candidate_request,
    replay_request,
    stored_request,
    with_stream_usage,
)
from mirror.sampling import Sampler
from mirror.shadow import Shadows
from mirror.trace import Outcome, StreamTrace, parse_body, stream_trace
from shadow_ab.records import Endpoint, Role, Status, utcnow

ROUTES: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint.CHAT,
    "/v1/completions": Endpoint.COMPLETIONS,
}
"""The generate routes (canonical paths): shadowed and recorded."""

# Shadow decisions (label values of shadow_ab_mirror_shadow_decisions_total).
SAMPLED = "sampled"
SKIPPED_SAMPLE = "skipped_sample"
SKIPPED_CAP = "skipped_cap"
SKIPPED_GUARD = "skipped_guard"
SKIPPED_MALFORMED = "skipped_malformed"
SKIPPED_HOSTILE = "skipped_hostile"
"""A body past the bounds on JSON work (mirror/body.py: depth, containers, values, strings)."""
SKIPPED_TOO_LARGE = "skipped_too_large"
SKIPPED_LOAD_PARITY = "skipped_load_parity"
SKIPPED_OVERLOAD = "skipped_overload"
DECISIONS = (
    SAMPLED,
    SKIPPED_SAMPLE,
    SKIPPED_CAP,
    SKIPPED_GUARD,
    SKIPPED_MALFORMED,
    SKIPPED_HOSTILE,
    SKIPPED_TOO_LARGE,
    SKIPPED_LOAD_PARITY,
    SKIPPED_OVERLOAD,
)


class Prepared:
    """A generate request made ready for the incumbent (:meth:`ExchangeCore.prepare`): its
    request target (the route and the client's query, after the incumbent URL's path), the
    record stub, the body and headers it
    gets, and the shadow tasks already fired (cancel them when the client leaves)."""

    __slots__ = (
        "body",
        "chat",
        "d",
        "raw_headers",
        "shadow_active",
        "shadows",
        "strip",
        "t_ready",
        "target",
    )

    def __init__(
        self,
        *,
        target: bytes,
        d: Dispatch,
        body: bytes,
        raw_headers: list[tuple[bytes, bytes]],
        strip: bool,
        chat: bool,
        t_ready: float,
        shadow_active: bool,
        shadows: list[asyncio.Task[None]],
    ) -> None:
        self.target = target
        self.d = d
        self.body = body
        self.raw_headers = raw_headers
        self.strip = strip
        self.chat = chat
        self.t_ready = t_ready
        self.shadow_active = shadow_active
        self.shadows = shadows


class ExchangeCore:
    """The generate requests' shared steps (see the module docstring). One per mirror."""

    def __init__(
        self,
        settings: MirrorSettings,
        recorder: Recorder,
        shadows: Shadows,
        *,
        guard: InterferenceGuard,
        sampler: Sampler,
        loop_lag: LoopLag,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.shadows = shadows
        self.guard = guard
        self.sampler = sampler
        self.loop_lag = loop_lag
        self.clock = clock
        self.wall = wall
        self.inc_engine = settings.incumbent_engine()
        self.candidate_own = settings.candidate.own_headers("candidate")
        """The candidate's own credentials and headers (from the settings)."""
        self.candidate_forward = frozenset(settings.candidate.forward_headers)
        """Client headers the candidate may get (the allow-list)."""
        self.incumbent_own = settings.incumbent.own_headers("incumbent")
        """The incumbent's own headers, for the mirror's own requests to it (probes)."""
        self.response_drop = RESPONSE_DROP
        """Incumbent response headers never passed to a client."""
        self.draining = False
        self._m_decision = {d: m.SHADOW_DECISIONS.labels(decision=d) for d in DECISIONS}
        self._m_requests_cache: dict[tuple[str, int], Any] = {}

    def count_decision(self, decision: str) -> None:
        """Count a shadow decision (one of :data:`DECISIONS`)."""
        self._m_decision[decision].inc()

    def count_request(self, route: str, code: int) -> None:
        """Count a client request's answer (``shadow_ab_mirror_requests_total``; the children
        of the hot routes and statuses are looked up once: ``labels()`` costs microseconds)."""
        child = self._m_requests_cache.get((route, code))
        if child is None:
            child = m.REQUESTS.labels(route=route, code=str(code))
            if len(self._m_requests_cache) < 1024:
                self._m_requests_cache[(route, code)] = child
        child.inc()

    def prepare(
        self,
        headers: list[tuple[bytes, bytes]],
        query: bytes,
        body: bytes,
        endpoint: Endpoint,
        route: str,
    ) -> Prepared:
        """Everything of a generate request before the incumbent is asked: the pair id, the
        shadow decision (counted), the shadow requests fired, the incumbent's body, headers and
        record stub (:class:`Prepared`); the incumbent's request counted in flight until
        :meth:`settle`, which must follow. ``headers``: the client's, names lower-case;
        ``query``: its query string (passed on to the incumbent); ``route``: the canonical
        path. Never raises for anything in the request."""
        t_ready = self.clock()
        pair = uuid.uuid4()
        pid = str(pair).encode()
        inspected = inspect_body(body)
        parsed = inspected.body
        chat = endpoint is Endpoint.CHAT

        inflight = self.recorder.inflight
        # The shadow decision: never queued, counted either way.
        if parsed is None:
            if inspected.reason == MALFORMED:
                decision = SKIPPED_MALFORMED
            else:
                decision = SKIPPED_HOSTILE
                m.BODIES_REFUSED.labels(reason=inspected.reason).inc()
        else:
            sampler = self.sampler
            hv = header_value(headers, sampler.header) if sampler.header else None
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
                inflight[Role.CANDIDATE], inflight[Role.INCUMBENT]
            ):
                decision = SKIPPED_LOAD_PARITY
            else:
                decision = SAMPLED
        self.count_decision(decision)
        privacy = self.recorder.privacy
        capture = privacy.level_for(header_value(headers, privacy.header))

        up_headers = upstream_headers(headers, pid)
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
        inflight_inc = inflight.incumbent_load()
        inflight_cand = inflight[Role.CANDIDATE]

        shadows: list[asyncio.Task[None]] = []
        if decision == SAMPLED:
            assert parsed is not None
            sh_headers = str_headers(shadow_headers(up_headers))
            cand_headers = candidate_headers(sh_headers, self.candidate_forward, self.candidate_own)
            cand_body, cand_rewrites = candidate_request(
                parsed, chat=chat, rewrite=self.settings.candidate.rewrite
            )
            asks = self.shadows.asks
            k = asks.top_logprobs(route, chat=chat, k=self.settings.shadow.top_logprobs)
            cand_body, cand_rewrites = ask_top_logprobs(cand_body, cand_rewrites, chat=chat, k=k)
            # the mirror's ask alone: a refusal naming it is the mirror's doing
            ask = (
                LOGPROBS
                if cand_rewrites[-1:] == [LOGPROBS] and not client_asks_logprobs(parsed)
                else None
            )
            cand_rewrites = [*cand_rewrites, *asks.notes(parsed)]
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
                    Role.CANDIDATE, route, cand_body, cand_rewrites, cand_headers, common, ask=ask
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
                    cache_salt=uuid.uuid4().hex,
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
            sent_at=self.wall(),
            request=stored_request(inc_request) if inc_request is not None else {},
            rewrites=inc_rewrites,
            inflight_incumbent=inflight_inc,
            inflight_candidate=inflight_cand,
            guard=guard_state,
            capture=capture,
        )
        inflight.start(Role.INCUMBENT)  # ended by settle()
        return Prepared(
            target=route.encode("latin-1") + b"?" + query if query else route.encode("latin-1"),
            d=d,
            body=inc_body,
            raw_headers=up_headers,
            strip=strip,
            chat=chat,
            t_ready=t_ready,
            shadow_active=self.shadows.inflight > 0,
            shadows=shadows,
        )

    def settle(
        self,
        p: Prepared,
        *,
        route: str,
        client_code: int,
        status: Status,
        http_status: int | None,
        error: str | None,
        stash: list[tuple[float, bytes]] | None,
        parts: list[bytes],
        t0: float,
        last_t: float | None,
    ) -> None:
        """The end of the incumbent exchange of ``p`` (after the client's answer is complete,
        or cut): in-flight count and request metric, the stream parsed into its record
        (``stash``: an SSE stream's chunks with their arrival times; ``parts``: a body's),
        the guard fed, the record handed to the sink. Never raises."""
        d, chat = p.d, p.chat
        self.recorder.inflight.end(d.role)
        self.count_request(route, client_code or 499)
        trace = stream_trace(stash, t0, chat=chat) if stash is not None else None
        outcome = _outcome(trace, parts, chat, t0, last_t, status)
        if status is Status.HTTP_ERROR and parts:
            error = error_text(b"".join(parts)[:ERROR_BODY_KEEP])
        if status is Status.OK:
            self.guard.observe(outcome.ttft_s, outcome.e2e_s, p.shadow_active)
        self.recorder.record(d, status, outcome, http_status, error)


def _outcome(
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
