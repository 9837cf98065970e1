"""Several mirror processes on one port, one per core (``workers: N``, ``--workers N``).

One mirror process runs one event loop on one core (mirror/README.md, "More than one core").
With ``workers`` above 1, ``shadow-ab mirror`` becomes a small supervisor, as nginx's master
and uvicorn's ``--workers`` are: it reserves the client port, starts ``workers`` mirror
processes that listen on it with ``SO_REUSEPORT`` (the kernel spreads new connections across
them), and keeps them running:

- **What each worker gets** (:func:`worker_settings`; it listens with ``SO_REUSEPORT``,
  :func:`mirror.cli.run_worker`): the admin port
  ``admin_port + i`` (its own ``/metrics`` and ``/healthz``; ``admin_port: 0`` gives each a
  free one); with Kafka, the spool folder ``<spool_dir>.worker-<i>`` for worker ``i > 0``
  (worker 0 keeps ``spool_dir``: records a single mirror spooled are delivered by it). Probes
  and the health sampler run in worker 0 only, so the engines get one set of each.
- **A worker that dies** (killed, crashed) is started again, after 1 s and twice as long after
  each quick failure (up to 30 s); the others serve the port meanwhile. A worker that fails
  three times in a row within 30 s of its start (a port, a spool folder or a store it cannot
  open) stops the whole mirror with exit status 1: its log says why.
- **Connections queued at a worker that dies** are reset by Linux unless
  ``net.ipv4.tcp_migrate_req`` is 1 (then the other workers take them): the supervisor logs a
  warning at start when it is 0 (:func:`~mirror.listen.reset_on_close_warning`).
- **SIGTERM or SIGINT** is passed to every worker; each drains as a single mirror does (answers
  in flight, shadow requests, the sink); the supervisor exits 0 when every worker did, else 1.

Errors: :class:`~mirror.config.MirrorConfigError` from :func:`worker_settings` (an admin port
plus ``workers`` past 65535, or one of them the client port) and :func:`reserved_port` (the
port is taken); the workers' own errors are in their logs.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from mirror.config import SINK_CLOSE_TIMEOUT_S, MirrorConfigError, MirrorSettings
from mirror.listen import ListenError, bound_socket, reset_on_close_warning

log = logging.getLogger("mirror.workers")

QUICK_S = 30.0
"""A worker that exits within this long of its start failed quickly (a worker's start, its
imports and binds, takes 1-10 s on a busy machine)."""
QUICK_FAILURES = 3
"""Quick failures in a row after which the supervisor gives up."""
BACKOFF_MAX_S = 30.0

WorkerMain = Callable[[MirrorSettings, bool], None]
"""A worker's body: serve ``settings`` until SIGTERM (``verbose``: log at DEBUG)."""


def worker_settings(settings: MirrorSettings, index: int, port: int) -> MirrorSettings:
    """The settings of worker ``index`` listening on ``port`` with the others."""
    admin = settings.admin_port + index if settings.admin_port else 0
    if admin > 65535:
        raise MirrorConfigError(
            f"admin_port {settings.admin_port} + workers {settings.workers} passes 65535: each"
            " worker serves /metrics on admin_port + its index; choose a lower admin_port"
        )
    if admin and admin == port:
        raise MirrorConfigError(
            f"worker {index}'s admin port (admin_port {settings.admin_port} + {index}) is the"
            f" client port {port}: choose an admin_port whose next {settings.workers} ports"
            " are free"
        )
    update: dict[str, Any] = {"port": port, "admin_port": admin, "workers": 1}
    if index > 0:
        update["health_enabled"] = False
        update["probes"] = settings.probes.model_copy(update={"per_minute": 0})
        if settings.kafka is not None:
            spool = f"{settings.kafka.spool_dir}.worker-{index}"
            update["kafka"] = settings.kafka.model_copy(update={"spool_dir": Path(spool)})
    return settings.model_copy(update=update)


@contextlib.contextmanager
def reserved_port(host: str, port: int) -> Iterator[int]:
    """Hold ``host:port`` (a free one when 0) with ``SO_REUSEPORT`` and without listening, so
    the workers can bind it and nothing else takes it between their restarts."""
    try:
        sock = bound_socket(host, port, "client port", reuse_port=True, listen=False)
    except ListenError as exc:
        raise MirrorConfigError(str(exc)) from None
    with sock:
        yield int(sock.getsockname()[1])


class Supervisor:
    """Starts the workers, starts a dead one again, passes the stop signals on."""

    def __init__(self, settings: MirrorSettings, main: WorkerMain, verbose: bool) -> None:
        self.settings = settings
        self.main = main
        self.verbose = verbose
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.started_at: list[float] = []
        self.quick: list[int] = []
        self.restart_at: dict[int, float] = {}
        self.stopping = False

    def run(self) -> int:
        s = self.settings
        with reserved_port(s.host, s.port) as port:
            configs = [worker_settings(s, i, port) for i in range(s.workers)]
            previous = {
                sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
            }
            try:
                log.info("%d mirror workers on %s:%d", s.workers, s.host, port)
                if warning := reset_on_close_warning():
                    log.warning("%s", warning)
                for config in configs:
                    self.procs.append(self._start(config))
                    self.started_at.append(time.monotonic())
                    self.quick.append(0)
                failed = self._watch(configs)
                return self._join() or failed
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _start(self, config: MirrorSettings) -> Any:
        proc = self.ctx.Process(
            target=self.main, args=(config, self.verbose), name="shadow-ab-mirror-worker"
        )
        proc.start()
        return proc

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("signal %d: stopping %d workers", signum, len(self.procs))
        self.stopping = True
        for proc in self.procs:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()

    def _watch(self, configs: list[MirrorSettings]) -> int:
        """Until a stop signal: start dead workers again; 1 when one keeps failing at start."""
        while not self.stopping:
            sentinels = [p.sentinel for p in self.procs if p.is_alive()]
            multiprocessing.connection.wait(sentinels, timeout=0.5)
            now = time.monotonic()
            for i, proc in enumerate(self.procs):
                if self.stopping or proc.is_alive():
                    continue
                if i not in self.restart_at:
                    ran = now - self.started_at[i]
                    self.quick[i] = self.quick[i] + 1 if ran < QUICK_S else 0
                    if self.quick[i] >= QUICK_FAILURES:
                        log.error(
                            "mirror worker %d failed %d times within %.0f s of its start (last"
                            " exit status %s): stopping the mirror; its log above says why",
                            i,
                            self.quick[i],
                            QUICK_S,
                            proc.exitcode,
                        )
                        self.stopping = True
                        for other in self.procs:
                            if other.is_alive():
                                other.terminate()
                        return 1
                    delay = min(BACKOFF_MAX_S, 2.0 ** max(0, self.quick[i] - 1))
                    log.error(
                        "mirror worker %d (pid %s) exited with status %s after %.0f s; starting"
                        " it again in %.0f s (the other workers serve meanwhile)",
                        i,
                        proc.pid,
                        proc.exitcode,
                        ran,
                        delay,
                    )
                    self.restart_at[i] = now + delay
                elif now >= self.restart_at[i]:
                    del self.restart_at[i]
                    self.procs[i] = self._start(configs[i])
                    self.started_at[i] = time.monotonic()
        return 0

    def _join(self) -> int:
        """Wait for every worker to drain; kill what is left after its drain's time."""
        s = self.settings
        deadline = time.monotonic() + s.drain_timeout_s + SINK_CLOSE_TIMEOUT_S + 15.0
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        status = 0
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                log.error("mirror worker %d (pid %s) did not stop in time: killed", i, proc.pid)
                proc.kill()
                proc.join(5.0)
                status = 1
            elif proc.exitcode not in (0, None) and i not in self.restart_at:
                log.error("mirror worker %d stopped with status %s", i, proc.exitcode)
                status = 1
        return status


def supervise(settings: MirrorSettings, main: WorkerMain, verbose: bool) -> int:
    """Run ``settings.workers`` mirror processes on one port until SIGTERM/SIGINT; the exit
    status (0 when every worker stopped cleanly)."""
    return Supervisor(settings, main, verbose).run()
