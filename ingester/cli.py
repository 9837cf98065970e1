"""``shadow-ab ingest``: consume ``shadow.exchanges`` and ``shadow.health`` into the store."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import Any

import click
from pydantic import ValidationError

from ingester.errors import IngestError
from ingester.settings import IngestSettings

log = logging.getLogger("ingester")


def load_settings(**overrides: Any) -> IngestSettings:
    """Settings from flags (non-None overrides), environment and env file, or a usage error."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return IngestSettings(**given)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{_where(loc)}: {msg}" if loc else msg)
        raise click.UsageError("invalid settings:\n  " + "\n  ".join(lines)) from None


@click.command("ingest")
@click.option("--kafka", "kafka_bootstrap", help="Kafka bootstrap HOST:PORT[,HOST:PORT].")
@click.option("--database-url", help="Store URL, e.g. postgresql+psycopg://user@host:port/db.")
@click.option("--group", "ingest_group", help="Consumer group id.")
@click.option("--batch-size", "ingest_batch_size", type=int, help="Messages per batch.")
@click.option("--batch-timeout-ms", "ingest_batch_timeout_ms", type=int, help="Max age of a batch.")
@click.option(
    "--workers",
    "ingest_workers",
    type=int,
    help="Consumer processes in the group; each takes some of the partitions. 2 on 2 cores.",
)
@click.option(
    "--metrics-port", "ingest_metrics_port", type=int, help="Prometheus port on 127.0.0.1 (0=off)."
)
@click.option("--exchanges-topic", "ingest_topic_exchanges", help="Topic of exchange records.")
@click.option("--health-topic", "ingest_topic_health", help="Topic of health samples.")
@click.option("--dlq-topic", "ingest_topic_dlq", help="Dead-letter topic.")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
def ingest(verbose: bool, **flags: Any) -> None:
    """Consume Kafka records into the store; offsets are committed after the store commits.

    Poison messages go to the dead-letter topic with the reason in a header. While the store is
    unreachable, consumption pauses and the batch is retried with backoff. SIGTERM or SIGINT
    write and commit the current batch, then exit 0.

    With --workers N, N consumer processes share the consumer group (Python runs one core per
    process); SIGTERM/SIGINT are passed on to each, worker i serves metrics on port + i, and
    the command exits non-zero if any worker did.
    """
    _log_setup(verbose)
    settings = load_settings(**flags)
    if settings.ingest_workers > 1:
        from ingester.workers import run_workers

        raise SystemExit(run_workers(settings, verbose))
    run_one(settings)


def _log_setup(verbose: bool, prefix: str = "") -> None:
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


_FLAGS = {
    "kafka_bootstrap": "--kafka",
    "database_url": "--database-url",
    "ingest_group": "--group",
    "ingest_batch_size": "--batch-size",
    "ingest_batch_timeout_ms": "--batch-timeout-ms",
    "ingest_workers": "--workers",
    "ingest_metrics_port": "--metrics-port",
    "ingest_topic_exchanges": "--exchanges-topic",
    "ingest_topic_health": "--health-topic",
    "ingest_topic_dlq": "--dlq-topic",
}


def _where(field: str) -> str:
    """How a user sets a settings field: its flag (if any) and its environment variable."""
    env = f"SHADOW_AB_{field.upper()}"
    flag = _FLAGS.get(field)
    return f"{flag} / {env}" if flag else env
