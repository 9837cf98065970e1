"""The shadow dispatch: the candidate's (and the replay's) copy of a client request.

**The promise kept here: the client's path never waits on the shadow** (docs/architecture.md,
"Promises"). :meth:`Shadows.fire` schedules a shadow request as an asyncio task and returns at
once; :mod:`mirror.app`'s client path only ever fires (and, when its client disconnects, cancels
the pair's tasks). It awaits nothing in this module: a shadow request that is slow, fails or
hangs changes what the sink records, never what or when the client is answered. The one await
on the shadow is :meth:`Shadows.drain`, at shutdown, once the server takes no more requests.

A replay waits ``shadow.replay_delay_s`` before it is sent and goes through its own connection
pool (``shadow.replay_pool``), so it is not batched with the request it repeats: the noise floor
is the incumbent's run-to-run variation, not an echo of one batch (a replay cancelled while it
waits was never sent and is not recorded). A shadow request ends within ``shadow.timeout_s``
(a timeout is recorded, not raised); its answer is read whole (a stream's chunks are kept with
their arrival times and parsed at the end, :func:`mirror.trace.stream_trace`) and becomes one
record handed to the sink. Whole, up to :data:`mirror.shadow_client.ANSWER_MAX_BYTES` (the
candidate is outside the trust boundary): a longer answer is cut there, its connection closed,
and recorded as ``connection_error`` with the error "answer truncated at N bytes"
(:data:`shadow_ab.records.ANSWER_TRUNCATED`) and nothing of what arrived (neither parsed nor
kept: no text, logprobs or timings), counted in
``shadow_ab_mirror_shadow_answers_truncated_total``.

The requests go through this module's own raw connection pools (:mod:`mirror.shadow_client`:
one per engine, plus the replays' own), not aiohttp: a chunk costs one parser callback instead
of a stream-reader feed and a task wake-up. A replay with ``shadow.replay_pool: shared`` uses
the clients' pool: on the protocol data plane its :class:`~mirror.upstream.Upstream`, on the
ASGI plane the aiohttp session (the one path left on aiohttp).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from mirror.metrics import SHADOW_TRUNCATED
from mirror.recording import ERROR_BODY_KEEP, Dispatch, error_text, status_of
from mirror.rewrite import stored_request
from mirror.shadow_client import (
    ANSWER_MAX_BYTES,
    PIECE_COST,
    AnswerTruncated,
    ShadowAnswer,
    request_head,
)
from mirror.trace import Outcome, parse_body, stream_trace
from shadow_ab.records import Endpoint, Role, Status

if TYPE_CHECKING:
    from mirror.app import Mirror
    from mirror.upstream import Upstream

log = logging.getLogger(__name__)


class Shadows:
    """The shadow requests of one :class:`~mirror.app.Mirror`: fired as tasks, counted, drained.

    It sends through its own connection pools (:meth:`start`) and hands records to the mirror's sink
    (``Mirror._finish``), sharing its in-flight counters."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror
        self.inflight = 0
        """Shadow requests not finished yet (the cap, ``shadow.max_concurrent``, is on this)."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.pools: dict[Role, Upstream] = {}
        """Raw connection pools per role (:meth:`start`); a role without one uses aiohttp."""
        self.client_pool: Upstream | None = None
        """The clients' pool to the incumbent on the protocol data plane (shared replays)."""

    def start(self) -> None:
        """Open the candidate's and the replays' pools (at the mirror's start)."""
        from mirror.upstream import Upstream

        mirror = self._mirror
        s = mirror.settings
        if mirror.candidate_session is None:  # else the session handed to the mirror is used
            self.pools[Role.CANDIDATE] = Upstream.to(s.candidate)
        if s.shadow.replay_pool == "separate":
            self.pools[Role.REPLAY] = Upstream.to(s.incumbent)
        elif self.client_pool is not None:
            self.pools[Role.REPLAY] = self.client_pool

    def close(self) -> None:
        """Close the pools' idle connections (after the drain)."""
        for pool in self.pools.values():
            if pool is not self.client_pool:  # the clients' pool is the data plane's to close
                pool.close()
        self.pools.clear()

    def fire(
        self,
        role: Role,
        route: str,
        body: dict[str, Any],
        rewrites: list[str],
        headers: list[tuple[str, str]],
        common: dict[str, Any],
    ) -> asyncio.Task[None]:
        """Schedule one shadow request (``role`` candidate or replay) and return its task at
        once: the caller must not await it."""
        self.inflight += 1
        task = asyncio.create_task(self._send(role, route, body, rewrites, headers, common))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drain(self, timeout_s: float) -> None:
        """Let the shadow requests in flight finish, up to ``timeout_s``; cancel the rest (they
        are recorded as cancelled)."""
        pending = set(self.tasks)
        if not pending:
            return
        log.info("draining %d shadow requests", len(pending))
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for t in late:
            t.cancel()
        if late:
            await asyncio.wait(late)

    async def _send(
        self,
        role: Role,
        route: str,
        body: dict[str, Any],
        rewrites: list[str],
        headers: list[tuple[str, str]],
        common: dict[str, Any],
    ) -> None:
        mirror = self._mirror
        pool = self.pools.get(Role.REPLAY if role is Role.INCUMBENT else role)  # probes
        if role is Role.CANDIDATE:
            session, url, engine = mirror.candidate_session, mirror.cand_url, mirror.cand_engine
        else:
            session, url, engine = mirror.incumbent_session, mirror.inc_url, mirror.inc_engine
            delay = mirror.settings.shadow.replay_delay_s
            if delay > 0:  # not in the original's batch: the incumbent's own run-to-run noise
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    self.inflight -= 1  # never sent: no exchange to record
                    raise
        assert pool is not None or session is not None, "the mirror's lifespan has not started"
        chat = common["endpoint"] is Endpoint.CHAT
        clock = mirror._clock
        status = Status.OK
        http_status: int | None = None
        error: str | None = None
        sse = False
        stash: list[tuple[float, bytes]] = []
        raw = b""
        last_t: float | None = None
        mirror._inflight[role] += 1
        mirror._m_inflight[role].inc()
        d = Dispatch(
            role=role,
            engine=engine,
            sent_at=mirror._wall(),
            request=stored_request(body),
            rewrites=rewrites,
            **common,
        )
        payload = orjson.dumps(body)
        answer: ShadowAnswer | None = None
        truncated = False
        t0 = clock()
        try:
            async with asyncio.timeout(mirror.settings.shadow.timeout_s):
                if pool is not None:
                    # parsed when the answer ends (mirror.trace.stream_trace)
                    answer = ShadowAnswer(clock)
                    stash = answer.stash
                    head = request_head("POST", mirror._url(url, route).raw_path_qs, pool, headers)
                    await answer.fetch(pool, head, payload)
                else:
                    assert session is not None
                    async with session.post(
                        mirror._url(url, route), data=payload, headers=headers
                    ) as resp:
                        http_status = resp.status
                        status = status_of(resp.status)
                        sse = resp.content_type == "text/event-stream"
                        parts: list[bytes] = []
                        kept = 0  # charged as mirror.shadow_client does
                        async for chunk in resp.content.iter_any():
                            kept += len(chunk) + PIECE_COST
                            if kept > ANSWER_MAX_BYTES:
                                resp.close()  # the engine sees it go and stops generating
                                raise AnswerTruncated(ANSWER_MAX_BYTES, "as kept")
                            if sse:  # parsed when the stream ends (mirror.trace.stream_trace)
                                stash.append((clock(), chunk))
                            else:
                                parts.append(chunk)
                        if not sse:
                            raw = b"".join(parts)
                            last_t = clock()
        except TimeoutError:
            status, error = (
                Status.TIMEOUT,
                f"no complete answer within {mirror.settings.shadow.timeout_s}s",
            )
        except AnswerTruncated as exc:
            status, error, truncated = Status.CONNECTION_ERROR, str(exc), True
            SHADOW_TRUNCATED.labels(role=role.value).inc()
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status, error = Status.CONNECTION_ERROR, repr(exc)
        except asyncio.CancelledError:
            status, error = Status.CANCELLED, "the client disconnected or the mirror stopped"
            raise
        finally:
            if answer is not None:
                if answer.status is not None:
                    http_status = answer.status
                    if status is Status.OK:
                        status = status_of(answer.status)
                sse, last_t = answer.sse, answer.last_t
                if not sse and status in (Status.OK, Status.HTTP_ERROR):  # else never read
                    raw = b"".join(answer.parts)
            mirror._inflight[role] -= 1
            mirror._m_inflight[role].dec()
            self.inflight -= 1
            if truncated:  # what arrived is no answer: not parsed, not kept in the record
                outcome = Outcome()
            elif sse:
                outcome = stream_trace(stash, t0, chat=chat).outcome()
            elif status is Status.OK and last_t is not None:
                outcome = parse_body(raw, chat=chat, e2e_s=last_t - t0)
            else:
                outcome = Outcome(e2e_s=max(0.0, last_t - t0) if last_t is not None else None)
            if status is Status.HTTP_ERROR:
                error = error_text(raw[:ERROR_BODY_KEEP])
            mirror._finish(d, status, outcome, http_status, error)
