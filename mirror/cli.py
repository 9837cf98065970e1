"""``shadow-ab mirror``: serve the incumbent, mirror sampled traffic to the candidate.

Runs :func:`mirror.app.create_app` on uvicorn (uvloop, httptools). SIGTERM or SIGINT: stop
accepting, let the requests in flight finish, let shadow requests finish (``drain_timeout_s``),
flush and close the record sink, exit 0. ``--health-only`` runs just the health sampler (for a
separate Kubernetes Deployment that keeps scraping while the mirror is rolled).
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from mirror.config import MirrorConfigError, MirrorSettings, load_settings

if TYPE_CHECKING:
    from mirror.sinks import RecordSink

log = logging.getLogger("mirror")


@click.command("mirror")
@click.option("--incumbent", help="The incumbent engine's URL (serves the clients).")
@click.option("--candidate", help="The candidate engine's URL (gets the shadow copies).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8080; 0 = any free port).")
@click.option(
    "--config", "config", type=click.Path(path_type=Path), help="YAML file of mirror settings."
)
@click.option("--kafka", "kafka_bootstrap", help="Kafka bootstrap HOST:PORT: records go to Kafka.")
@click.option("--database-url", help="Store URL for the direct sink (when no Kafka).")
@click.option("--deployment", help="Deployment name carried by every record.")
@click.option("--shadow-rate", type=float, help="Fraction of requests shadowed, 0..1.")
@click.option("--shadow-header", help="Sample consistently by this header (e.g. x-session-id).")
@click.option("--replay-rate", type=float, help="Fraction of shadowed requests also replayed.")
@click.option("--max-shadow", type=int, help="Most shadow requests in flight.")
@click.option(
    "--load-parity",
    type=float,
    metavar="RATIO",
    help="Keep the candidate's requests in flight at most RATIO times the incumbent's (at"
    " dispatch); requests past it are not shadowed (skipped_load_parity).",
)
@click.option(
    "--health-only",
    is_flag=True,
    help="Run only the health sampler (serving /metrics and /healthz on --host/--port).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
def mirror(
    incumbent: str | None,
    candidate: str | None,
    config: Path | None,
    shadow_rate: float | None,
    shadow_header: str | None,
    replay_rate: float | None,
    max_shadow: int | None,
    load_parity: float | None,
    health_only: bool,
    verbose: bool,
    **flags: Any,
) -> None:
    """Serve the incumbent engine and mirror sampled requests to the candidate.

    Settings come from flags, then SHADOW_AB_MIRROR_* environment variables (nested with __,
    e.g. SHADOW_AB_MIRROR_SHADOW__RATE), then the --config YAML file; see mirror/README.md.
    """
    shadow = {
        k: v
        for k, v in (
            ("rate", shadow_rate),
            ("header", shadow_header),
            ("replay_rate", replay_rate),
            ("max_concurrent", max_shadow),
            ("load_parity", load_parity),
        )
        if v is not None
    }
    try:
        settings = load_settings(
            config,
            incumbent={"url": incumbent} if incumbent else None,
            candidate={"url": candidate} if candidate else None,
            shadow=shadow or None,
            **flags,
        )
    except MirrorConfigError as exc:
        raise click.UsageError(str(exc)) from None
    logging.basicConfig(
        level=logging.DEBUG if verbose else getattr(logging, settings.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    sink = _open_sink(settings)
    try:
        serve(settings, sink, health_only=health_only)
    finally:
        if not sink.close(settings.sink_close_timeout_s):
            log.warning("the sink could not deliver every record before closing")
    log.info("stopped")


def _open_sink(settings: MirrorSettings) -> RecordSink:
    from mirror.sinks import open_sink

    try:
        return open_sink(kafka=settings.kafka, database_url=settings.database_url)
    except Exception as exc:
        raise click.ClickException(f"cannot open the record sink: {exc}") from exc


def serve(settings: MirrorSettings, sink: RecordSink, *, health_only: bool = False) -> None:
    """Run the mirror (or only the health sampler, with its /metrics) until SIGTERM/SIGINT
    (uvicorn drains, the lifespan flushes)."""
    import uvicorn

    from mirror.admin import create_health_app
    from mirror.app import create_app

    app: Any = (
        create_health_app(settings, sink=sink) if health_only else create_app(settings, sink=sink)
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=settings.access_log,
        proxy_headers=False,  # the mirror reads no client address: no middleware per request
        log_level=settings.log_level,
        server_header=False,  # the client sees the incumbent's own Server and Date headers
        date_header=False,
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
    )
    server = uvicorn.Server(config)
    # The sink's writer thread holds the GIL while it encodes a batch; a short switch interval
    # hands the event loop (the clients' path) the GIL back sooner (default 5 ms).
    sys.setswitchinterval(0.001)
    # uvicorn restores the previous handlers and re-raises a caught signal after it stops; a
    # handler of our own keeps that from killing the process before the sink is closed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore_late_signal)
    server.run()
    if not server.started:
        raise click.ClickException(
            f"the mirror could not listen on {settings.host}:{settings.port} (see the log above)"
        )


def _ignore_late_signal(signum: int, frame: FrameType | None) -> None:
    log.info("signal %d after shutdown began: already stopping", signum)
