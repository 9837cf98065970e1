"""``shadow-ab mirror``: serve the incumbent, mirror sampled traffic to the candidate.

Runs :class:`mirror.app.Mirror`: the client port (:mod:`mirror.server`, raw asyncio transports
on uvloop, httptools parsers, the limits of :mod:`mirror.limits`), and the admin endpoints
(``/metrics``, ``/healthz``, ``/mirror/docs``, a small FastAPI app under uvicorn) on their own
port (``admin_port``) in the same event loop, so a client flood cannot starve the probes and
clients never see the admin endpoints. SIGTERM or SIGINT: stop accepting, let the requests in
flight finish, let shadow requests finish (``drain_timeout_s``), flush and close the record
sink, then close the admin port, exit 0. ``--health-only`` runs just the health sampler (for a
separate Kubernetes Deployment that keeps scraping while the mirror is rolled). ``--workers N``
runs N such mirror processes on the port under a supervisor (:mod:`mirror.workers`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from mirror.config import SINK_CLOSE_TIMEOUT_S, MirrorConfigError, MirrorSettings, load_settings
from mirror.listen import ListenError, bound_socket

if TYPE_CHECKING:
    from mirror.app import Mirror
    from mirror.sinks import RecordSink

log = logging.getLogger("mirror")


@click.command("mirror")
@click.option("--incumbent", help="The incumbent engine's URL (serves the clients).")
@click.option("--candidate", help="The candidate engine's URL (gets the shadow copies).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8080; 0 = any free port).")
@click.option("--admin-port", type=int, help="Port of /metrics, /healthz, /mirror/docs (8081).")
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
    "--workers",
    type=click.IntRange(1, 64),
    help="Mirror processes on --port, one per core (default 1); worker i serves /metrics on"
    " --admin-port + i (mirror/workers.py).",
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
    if settings.workers > 1:
        if health_only:
            raise click.UsageError("--health-only runs one sampler: leave --workers at 1")
        from mirror.workers import supervise

        _log_to_stderr(settings, verbose)
        try:
            status = supervise(settings, run_worker, verbose)
        except MirrorConfigError as exc:
            raise click.ClickException(str(exc)) from None
        log.info("stopped")
        sys.exit(status)
    _log_to_stderr(settings, verbose)
    _run(settings, health_only=health_only)


def _log_to_stderr(settings: MirrorSettings, verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else getattr(logging, settings.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _run(settings: MirrorSettings, *, health_only: bool = False, worker: bool = False) -> None:
    """One mirror process: open the sink, serve until SIGTERM/SIGINT, close the sink
    (``worker``: one of ``--workers N``, sharing the port)."""
    sink = _open_sink(settings)
    try:
        serve(settings, sink, health_only=health_only, reuse_port=worker)
    finally:
        if not sink.close(SINK_CLOSE_TIMEOUT_S):
            log.warning("the sink could not deliver every record before closing")
    log.info("stopped")


def run_worker(settings: MirrorSettings, verbose: bool) -> None:
    """A worker process of ``--workers N`` (mirror/workers.py); exit status 1 on an error it
    explains in its log. It listens with ``SO_REUSEPORT``, beside the other workers (the
    ``reuse_port`` setting until issue 26: the supervisor is the one who knows)."""
    _log_to_stderr(settings, verbose)
    try:
        _run(settings, worker=True)
    except click.ClickException as exc:
        log.error("mirror worker on admin port %d: %s", settings.admin_port, exc.format_message())
        sys.exit(1)


def _open_sink(settings: MirrorSettings) -> RecordSink:
    from mirror.sinks import open_sink

    try:
        return open_sink(
            kafka=settings.kafka,
            database_url=settings.database_url,
        )
    except Exception as exc:
        raise click.ClickException(f"cannot open the record sink: {exc}") from exc


def _uvicorn_common(settings: MirrorSettings) -> dict[str, Any]:
    """uvicorn's settings for the admin port (and the sampler's own with ``--health-only``)."""
    return {
        "loop": "uvloop",
        "access_log": False,
        "proxy_headers": False,
        "log_level": settings.log_level,
        "server_header": False,
    }


def bind(host: str, port: int, what: str, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on ``host:port`` (:func:`mirror.listen.bound_socket`); a usage
    error naming ``what`` when it cannot."""
    try:
        return bound_socket(host, port, what, reuse_port=reuse_port)
    except ListenError as exc:
        raise click.ClickException(str(exc)) from None


def serve(
    settings: MirrorSettings,
    sink: RecordSink,
    *,
    health_only: bool = False,
    reuse_port: bool = False,
) -> None:
    """Run the mirror (or only the health sampler, with its /metrics) until SIGTERM/SIGINT
    (the client server drains, then the mirror's shutdown flushes); ``reuse_port``: the
    client port is shared with other workers (``SO_REUSEPORT``, :mod:`mirror.workers`)."""
    import uvicorn
    import uvloop

    from mirror.admin import create_health_app
    from mirror.app import Mirror

    common = _uvicorn_common(settings)
    timeout = max(1, int(settings.drain_timeout_s))
    # The sink's writer thread holds the GIL while it encodes a batch; a short switch interval
    # hands the event loop (the clients' path) the GIL back sooner (default 5 ms).
    sys.setswitchinterval(0.001)
    # uvicorn restores the previous handlers and re-raises a caught signal after it stops; a
    # handler of our own keeps that from killing the process before the sink is closed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore_late_signal)
    if health_only:
        app: Any = create_health_app(settings, sink=sink)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                lifespan="on",
                timeout_graceful_shutdown=timeout,
                **common,
            )
        )
        server.run()
        if not server.started:
            raise click.ClickException(
                f"the sampler could not listen on {settings.host}:{settings.port} (see the log)"
            )
        return
    with (
        _listening(
            settings.host, settings.port, "client port", reuse_port=reuse_port
        ) as client_sock,
        _listening(settings.host, settings.admin_port, "admin port") as admin_sock,
    ):
        mirror_app = Mirror(settings, sink=sink)
        admin_config = uvicorn.Config(
            mirror_app.admin, lifespan="off", timeout_graceful_shutdown=1, **common
        )
        admin = _admin_server(admin_config)
        log.info(
            "clients on %s:%d, admin (/metrics, /healthz) on %s:%d",
            settings.host,
            client_sock.getsockname()[1],
            settings.host,
            admin_sock.getsockname()[1],
        )
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve_both(mirror_app, client_sock, admin, admin_sock))
        for sig in (signal.SIGTERM, signal.SIGINT):  # the loop's handlers are gone with it
            signal.signal(sig, _ignore_late_signal)


@contextlib.contextmanager
def _listening(
    host: str, port: int, what: str, *, reuse_port: bool = False
) -> Iterator[socket.socket]:
    sock = bind(host, port, what, reuse_port=reuse_port)
    try:
        yield sock
    finally:
        sock.close()


def _admin_server(config: Any) -> Any:
    """A uvicorn server that leaves the signals to the client server (which stops first)."""
    import uvicorn

    class AdminServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return AdminServer(config)


async def _serve_both(
    mirror: Mirror, client_sock: socket.socket, admin: Any, admin_sock: socket.socket
) -> None:
    """The client server (which owns the signals and the lifespan) and the admin server; the
    admin port closes after the client server has drained and flushed."""
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]), name="admin-server")
    try:
        await mirror.serve(client_sock)
    finally:
        admin.should_exit = True
        await admin_task


def _ignore_late_signal(signum: int, frame: FrameType | None) -> None:
    log.info("signal %d after shutdown began: already stopping", signum)
