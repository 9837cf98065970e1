"""``shadow-ab ingest --workers N``: N ingester processes in one consumer group.

One Python process uses one core (the GIL); decoding and building rows are CPU-bound, so a
second process on a second core takes half the partitions (``shadow.exchanges`` has 6) and
writes its batches in parallel. Nothing else changes: each worker is exactly the
single-process ingester (its own consumer, producer, connection pool), Kafka's group protocol
spreads the partitions, and every worker commits offsets only after its store commit.

The parent only supervises: it passes SIGTERM/SIGINT on to the workers (as SIGTERM, once:
each worker then writes and commits its batch and exits), and when one worker exits on its
own (a fatal error), it stops the others too, so the whole command fails visibly and a
supervisor restarts it rather than running on at a fraction of the throughput. Workers run in
their own process group (a terminal's Ctrl-C reaches the parent only, which passes it on once)
and are sent SIGTERM by the kernel if the parent dies.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from types import FrameType

from ingester.settings import IngestSettings

log = logging.getLogger("ingester")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the kernel sends this process SIGTERM when its parent dies (best effort)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: a killed parent leaves workers running
        pass


def _worker(settings: IngestSettings, index: int, verbose: bool, parent: int) -> None:
    os.setpgrp()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(1)
    from ingester.run import log_setup, run_one

    log_setup(verbose, prefix=f"[worker {index}] ")
    port = settings.ingest_metrics_port
    update: dict[str, object] = {"ingest_create_topics": False}
    if port:
        update["ingest_metrics_port"] = port + index
    import click

    try:
        run_one(settings.model_copy(update=update))
    except click.ClickException as exc:
        log.error("%s", exc.format_message())
        raise SystemExit(1) from exc


def run_workers(settings: IngestSettings, verbose: bool) -> int:
    """Run ``settings.ingest_workers`` workers until a signal; the exit code for the command."""
    if settings.ingest_metrics_port and settings.ingest_metrics_port + settings.ingest_workers > (
        65536
    ):
        raise SystemExit(f"--metrics-port {settings.ingest_metrics_port} + workers exceeds 65535")
    if settings.ingest_create_topics:
        from ingester.app import ensure_ingest_topics

        ensure_ingest_topics(settings)  # once, before the workers race to it
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=_worker,
            args=(settings, i, verbose, os.getpid()),
            name=f"ingest-worker-{i}",
        )
        for i in range(settings.ingest_workers)
    ]
    stopping = False

    def stop_all(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        log.info("stopping %d workers (each writes and commits its batch)", len(procs))
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    for p in procs:
        p.start()
    log.info("started %d ingester workers: pids %s", len(procs), [p.pid for p in procs])
    while any(p.is_alive() for p in procs):
        if not stopping and any(p.exitcode is not None for p in procs):
            dead = [(p.name, p.exitcode) for p in procs if p.exitcode is not None]
            log.error("worker exited on its own %s: stopping the others", dead)
            stop_all()
        time.sleep(0.2)
    codes = [p.exitcode for p in procs]
    failed = [c for c in codes if c != 0]
    if failed:
        log.error("workers exited with %s", codes)
        return 1
    log.info("all %d workers stopped cleanly", len(procs))
    return 0
