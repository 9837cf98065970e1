"""The shadow dispatch: the candidate's (and the replay's) copy of a client request.

**The promise kept here: the client's path never waits on the shadow** (docs/architecture.md,
"Promises"). :meth:`Shadows.fire` schedules a shadow request as an asyncio task and returns at
once; the client's path (:mod:`mirror.exchange`, :mod:`mirror.server`) only ever fires (and,
when its client disconnects, cancels the pair's tasks). It awaits nothing in this module: a
shadow request that is slow, fails or hangs changes what the sink records, never what or when
the client is answered. The one await on the shadow is :meth:`Shadows.drain`, at shutdown, once
the server takes no more requests.

A replay waits ``shadow.replay_delay_s`` before it is sent and goes through its own connection
pool, so it is not batched with the request it repeats: the noise floor
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
one per engine, plus the replays' own): a chunk costs one parser callback. Each exchange ends in the
:class:`~mirror.recorder.Recorder`, which this module shares with the client's path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from mirror.asks import REFUSED, Asks
from mirror.metrics import SHADOW_TRUNCATED
from mirror.recording import ERROR_BODY_KEEP, Dispatch, error_text, status_of
from mirror.rewrite import stored_request
from mirror.shadow_client import AnswerTruncated, ShadowAnswer, request_head
from mirror.trace import Outcome, parse_body, stream_trace
from mirror.upstream import KEEPALIVE_S, Upstream
from shadow_ab.records import Endpoint, Role, Status

if TYPE_CHECKING:
    from mirror.config import MirrorSettings
    from mirror.recorder import Recorder

log = logging.getLogger(__name__)


class Shadows:
    """The shadow requests of one mirror: fired as tasks, counted, drained.

    It sends through its own connection pools (:meth:`start`) and ends each exchange in
    ``recorder`` (:meth:`mirror.recorder.Recorder.record`), sharing its in-flight counts."""

    def __init__(
        self,
        settings: MirrorSettings,
        recorder: Recorder,
        *,
        clock: Callable[[], float],
        wall: Callable[[], datetime],
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.keepalive_s = keepalive_s
        self.clock = clock
        self.wall = wall
        self.inflight = 0
        """Shadow requests not finished yet (the cap, ``shadow.max_concurrent``, is on this)."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.pools: dict[Role, Upstream] = {}
        """Raw connection pools per role (:meth:`start`)."""
        self._engines = {
            Role.CANDIDATE: settings.candidate_engine(),
            Role.REPLAY: settings.incumbent_engine(),
        }
        self.asks = Asks(settings.candidate.flavor)
        """The asks added to the candidate's requests, and those it refused (:mod:`mirror.asks`)."""

    def start(self) -> None:
        """Open the candidate's and the replays' pools (at the mirror's start)."""
        s = self.settings
        self.pools[Role.CANDIDATE] = Upstream.to(s.candidate, keepalive_s=self.keepalive_s)
        self.pools[Role.REPLAY] = Upstream.to(s.incumbent, keepalive_s=self.keepalive_s)

    def close(self) -> None:
        """Close the pools' idle connections (after the drain)."""
        for pool in self.pools.values():
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
        *,
        ask: str | None = None,
    ) -> asyncio.Task[None]:
        """Schedule one shadow request (``role`` candidate or replay) and return its task at
        once: the caller must not await it. ``ask``: the one ask the mirror added to a request
        that had none of its own (``logprobs``), so a 400 refusing it is the mirror's doing
        (:meth:`mirror.asks.Asks.refused`)."""
        self.inflight += 1
        task = asyncio.create_task(self._send(role, route, body, rewrites, headers, common, ask))
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
        ask: str | None = None,
    ) -> None:
        engine_role = Role.REPLAY if role is Role.INCUMBENT else role  # probes: incumbent
        pool = self.pools.get(engine_role)
        engine = self._engines[engine_role]
        if role is not Role.CANDIDATE:
            delay = self.settings.shadow.replay_delay_s
            if delay > 0:  # not in the original's batch: the incumbent's own run-to-run noise
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    self.inflight -= 1  # never sent: no exchange to record
                    raise
        assert pool is not None, "the mirror has not started"
        chat = common["endpoint"] is Endpoint.CHAT
        clock = self.clock
        inflight = self.recorder.inflight
        timeout_s = self.settings.shadow.timeout_s
        status = Status.OK
        http_status: int | None = None
        error: str | None = None
        sse = False
        stash: list[tuple[float, bytes]] = []
        raw = b""
        last_t: float | None = None
        inflight.start(role)
        d = Dispatch(
            role=role,
            engine=engine,
            sent_at=self.wall(),
            request=stored_request(body),
            rewrites=rewrites,
            **common,
        )
        payload = orjson.dumps(body)
        answer: ShadowAnswer | None = None
        truncated = False
        t0 = clock()
        try:
            async with asyncio.timeout(timeout_s):
                # parsed when the answer ends (mirror.trace.stream_trace)
                answer = ShadowAnswer(clock)
                stash = answer.stash
                head = request_head("POST", pool.prefix + route, pool, headers)
                await answer.fetch(pool, head, payload)
        except TimeoutError:
            status, error = (
                Status.TIMEOUT,
                f"no complete answer within {timeout_s}s",
            )
        except AnswerTruncated as exc:
            status, error, truncated = Status.CONNECTION_ERROR, str(exc), True
            SHADOW_TRUNCATED.labels(role=role.value).inc()
        except (OSError, ValueError) as exc:
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
            inflight.end(role)
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
                if ask is not None and self.asks.refused(route, ask, http_status, error):
                    # the mirror's ask failed, not the candidate: never counted as its failure
                    status = Status.CANCELLED
                    d.rewrites = [*d.rewrites, f"{REFUSED}:{ask}"]
            self.recorder.record(d, status, outcome, http_status, error)
