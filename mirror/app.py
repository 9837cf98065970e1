"""The mirror assembled: its parts wired together, started, served and drained.

:class:`Mirror` builds one of each part from the settings and owns their lifecycle:

- :class:`~mirror.recorder.Recorder`: every exchange's record step (metrics, privacy, sink);
- :class:`~mirror.shadow.Shadows`: the candidate's and the replay's requests;
- :class:`~mirror.exchange.ExchangeCore`: a generate request's steps before and after the
  incumbent is asked (the shadow decision and hand-off; the record);
- :class:`~mirror.passthrough.Passthrough`: every other client request;
- :class:`~mirror.server.ClientServer`: the client port's bytes;
- the admin app (:func:`mirror.admin.admin_app`), the health sampler (:mod:`mirror.health`)
  and the probes (:mod:`mirror.probes`).

:meth:`Mirror.serve` runs the client port until SIGTERM/SIGINT, then drains: no new
connections, the answers in flight finish, the shadow requests finish (``drain_timeout_s``; the
rest are recorded as cancelled), the sink is flushed. A client that disconnects cancels the
incumbent's request and the pair's shadow requests; they are recorded as ``cancelled``.

Each engine answer becomes one :class:`~shadow_ab.records.ExchangeRecord` (roles
``incumbent``, ``candidate``, ``replay``) handed to the sink after the client's answer is
complete (shadow records when the shadow request ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp

from mirror.admin import admin_app
from mirror.config import SINK_CLOSE_TIMEOUT_S, MirrorSettings
from mirror.exchange import ExchangeCore
from mirror.guard import InterferenceGuard
from mirror.overload import LoopLag
from mirror.passthrough import Passthrough
from mirror.recorder import Recorder
from mirror.sampling import Sampler
from mirror.server import ClientServer
from mirror.shadow import Shadows
from mirror.sinks import sink_alive
from mirror.upstream import KEEPALIVE_S
from shadow_ab.gc_tuning import tune_for_serving
from shadow_ab.privacy import redact_url
from shadow_ab.records import Role, utcnow

if TYPE_CHECKING:
    from mirror.sinks import RecordSink

log = logging.getLogger(__name__)

GC_THRESHOLD = (10_000, 20, 20)
"""Collector thresholds while serving (default 700, 10, 10): a request makes hundreds of
short-lived objects, and the default gen-0 threshold ran a collection every few requests."""


def _tune_gc() -> None:
    """Move everything alive after start-up (modules, settings, pydantic and SQLAlchemy
    machinery) out of the collector's sight, and collect less often: the collector was ~6% of
    the mirror's CPU under load (py-spy --native)."""
    tune_for_serving(*GC_THRESHOLD)


class Mirror:
    """The assembled mirror (see the module docstring). ``guard``, ``sampler``, ``loop_lag``,
    ``clock``, ``wall`` and the pools' ``keepalive_s`` may be given (tests, with tight tuning);
    the rest comes from ``settings``."""

    def __init__(
        self,
        settings: MirrorSettings,
        *,
        sink: RecordSink,
        guard: InterferenceGuard | None = None,
        sampler: Sampler | None = None,
        loop_lag: LoopLag | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.recorder = Recorder(settings.deployment, sink, settings.privacy)
        self.shadows = Shadows(
            settings, self.recorder, clock=clock, wall=wall, keepalive_s=keepalive_s
        )
        self.core = ExchangeCore(
            settings,
            self.recorder,
            self.shadows,
            guard=guard or InterferenceGuard(settings.guard),
            sampler=sampler or Sampler(settings.shadow),
            loop_lag=loop_lag or LoopLag(settings.overload),
            clock=clock,
            wall=wall,
        )
        self.passthrough = Passthrough(settings, self.core.response_drop)
        self.server = ClientServer(settings, self.core, self.passthrough, keepalive_s=keepalive_s)
        self.admin = admin_app(self.health)
        self.started = False
        self._health_session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle --------------------------------------------------------------------------

    async def startup(self) -> None:
        """Open the pools and sessions, start the loop-lag probe, the health sampler and the
        probes (as configured)."""
        s = self.settings
        self.passthrough.start()
        self.shadows.start()
        self.core.loop_lag.start()
        if s.health_enabled:
            self._start_health()
        if s.probes.per_minute > 0:
            from mirror.probes import ProbeInjector

            injector = ProbeInjector(self.core, s.probes, self.passthrough.session)
            self._tasks.append(asyncio.create_task(injector.run(), name="probes"))
        _tune_gc()
        self.started = True
        log.info(
            "mirroring %s (incumbent) to %s (candidate), shadow rate %.3g, deployment %s",
            redact_url(s.incumbent.url),
            redact_url(s.candidate.url),
            s.shadow.rate,
            s.deployment,
        )

    def _start_health(self) -> None:
        from mirror.health import EngineTarget, HealthSampler

        s = self.settings
        targets = [
            EngineTarget(s.incumbent_engine(), Role.INCUMBENT, s.incumbent.url, s.incumbent.flavor),
            EngineTarget(s.candidate_engine(), Role.CANDIDATE, s.candidate.url, s.candidate.flavor),
        ]
        self._health_session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        sampler = HealthSampler(targets, self.sink, self._health_session, s.deployment, s.health)
        self._tasks.append(asyncio.create_task(sampler.run(), name="health-sampler"))

    async def shutdown(self) -> None:
        """Let shadow requests finish (up to ``drain_timeout_s``; the rest are recorded as
        cancelled), stop the probes and the health sampler, close sessions, flush the sink."""
        self.core.draining = True
        self.core.loop_lag.stop()
        await self.shadows.drain(self.settings.drain_timeout_s)
        self.shadows.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.passthrough.close()
        if self._health_session is not None:
            await self._health_session.close()
            self._health_session = None
        timeout = SINK_CLOSE_TIMEOUT_S
        flushed = await asyncio.to_thread(self.sink.flush, timeout)
        if not flushed:
            log.warning("the sink did not deliver every record within %.0fs", timeout)

    async def serve(self, sock: socket.socket) -> None:
        """Serve clients on ``sock`` until SIGTERM/SIGINT, then drain (module docstring)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.startup()
        try:
            await self.server.listen(sock)
            log.info("serving clients")
            await stop.wait()
            log.info("stopping: draining the answers in flight")
            self.core.draining = True
            await self.server.drain()
        finally:
            await self.shutdown()

    def health(self) -> dict[str, Any]:
        """The mirror's own state (``/healthz``): ``status`` is ``ok`` when it serves."""
        sink_ok = sink_alive(self.sink)
        core = self.core
        return {
            "status": "draining"
            if core.draining
            else "sink_dead"
            if not sink_ok
            else "ok"
            if self.started
            else "starting",
            "sink": "ok" if sink_ok else "dead",
            "deployment": self.settings.deployment,
            "inflight": {r.value: n for r, n in self.recorder.inflight.counts.items()},
            "shadow_inflight": self.shadows.inflight,
            "guard": core.guard.state(),
        }
