"""The mirror's own endpoints: ``/metrics``, ``/healthz`` and ``/mirror/docs``.

:func:`admin_app` is a small FastAPI application served on the mirror's admin port
(``admin_port``, :mod:`mirror.cli`), never on the client port. It reads the mirror's state
through one callable (:class:`mirror.app.Mirror`'s ``health``); ``/healthz`` answers 503 while
the mirror is starting or draining, or its sink is dead. :func:`create_health_app` is
the same for ``shadow-ab mirror --health-only`` (the health sampler alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mirror.config import SINK_CLOSE_TIMEOUT_S, MirrorSettings
from shadow_ab.records import Role

if TYPE_CHECKING:
    from mirror.sinks import RecordSink

log = logging.getLogger(__name__)

ADMIN_PATHS = frozenset({"/metrics", "/healthz", "/mirror/docs", "/mirror/openapi.json"})
"""The paths :func:`admin_app` serves (on the admin port)."""


def admin_app(health: Callable[[], dict[str, Any]]) -> FastAPI:
    """The mirror's own endpoints; ``health()`` is the mirror's state for ``/healthz`` (its
    ``status`` is ``ok`` when serving)."""

    api = FastAPI(
        title="shadow-ab mirror",
        description=(
            "The mirror's admin port. On the client port, POST /v1/chat/completions and"
            " /v1/completions are the incumbent's answers (plus an x-shadow-pair-id header),"
            " the configured pass-through routes the incumbent's too; any other path is 404."
        ),
        docs_url="/mirror/docs",
        openapi_url="/mirror/openapi.json",
        redoc_url=None,
    )

    @api.get("/metrics", summary="The mirror's Prometheus metrics")
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz", summary="The mirror's own health (not the engines')")
    def healthz() -> JSONResponse:
        body = health()
        # Liveness: a dead sink thread never recovers by itself; a restart does (the spool
        # and the queue's records are kept or counted). Not ready while starting or draining.
        return JSONResponse(body, status_code=200 if body.get("status") == "ok" else 503)

    return api


def create_health_app(settings: MirrorSettings, *, sink: RecordSink) -> FastAPI:
    """``--health-only``: the health sampler alone, with ``/metrics`` and ``/healthz``."""
    from mirror.health import EngineTarget, HealthSampler

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        targets = [
            EngineTarget(
                settings.incumbent_engine(),
                Role.INCUMBENT,
                settings.incumbent.url,
                settings.incumbent.flavor,
            ),
            EngineTarget(
                settings.candidate_engine(),
                Role.CANDIDATE,
                settings.candidate.url,
                settings.candidate.flavor,
            ),
        ]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
            sampler = HealthSampler(targets, sink, session, settings.deployment, settings.health)
            task = asyncio.create_task(sampler.run(), name="health-sampler")
            log.info("health sampling every %.1fs (health-only)", settings.health.interval_s)
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await asyncio.to_thread(sink.flush, SINK_CLOSE_TIMEOUT_S)

    api = FastAPI(
        title="shadow-ab health sampler", lifespan=lifespan, docs_url=None, redoc_url=None
    )

    @api.get("/metrics", summary="Prometheus metrics (shadow_ab_engine_*)")
    def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/healthz", summary="The sampler's own health")
    def healthz() -> JSONResponse:
        from mirror.sinks import sink_alive

        if not sink_alive(sink):
            return JSONResponse(
                {"status": "sink_dead", "sink": "dead", "deployment": settings.deployment},
                status_code=503,
            )
        return JSONResponse({"status": "ok", "sink": "ok", "deployment": settings.deployment})

    return api
