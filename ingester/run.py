"""One ingester in this process: what ``shadow-ab ingest`` runs, once or in each worker.

:func:`run_one` opens the processor (:mod:`ingester.app`), turns SIGTERM/SIGINT into a clean
stop (write and commit the current batch), runs until then and closes everything;
:func:`log_setup` configures logging to stderr, with a prefix per worker.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import click

from ingester.errors import IngestError
from ingester.settings import IngestSettings

log = logging.getLogger("ingester")


def log_setup(verbose: bool, prefix: str = "") -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_one(settings: IngestSettings) -> None:
    """One ingester in this process, until SIGTERM/SIGINT; raises SystemExit(1) or
    ClickException when it could not finish cleanly."""
    from ingester.app import close_all, open_processor
    from shadow_ab.topics import TopicError
    from storage.db import redact_url
    from storage.errors import StorageError

    try:
        processor, resources = open_processor(settings)
    except (IngestError, TopicError, StorageError) as exc:
        raise click.ClickException(str(exc)) from exc

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if processor.stopping:
            log.warning("second signal: exiting now without flushing (nothing committed is lost)")
            raise SystemExit(1)
        log.info("signal %d: writing the current batch, committing, then exiting", signum)
        processor.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "ingesting %s and %s into %s (group %s, batch %d / %d ms)",
        settings.ingest_topic_exchanges,
        settings.ingest_topic_health,
        redact_url(settings.database_url),
        settings.ingest_group,
        settings.ingest_batch_size,
        settings.ingest_batch_timeout_ms,
    )
    try:
        ok = processor.run(settings.ingest_shutdown_timeout_s)
    except IngestError as exc:
        close_all(resources)
        raise click.ClickException(str(exc)) from exc
    close_all(resources)
    if not ok:
        raise SystemExit(1)
    log.info("stopped cleanly")
