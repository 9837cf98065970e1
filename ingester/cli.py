"""``shadow-ab ingest``: consume ``shadow.exchanges`` and ``shadow.health`` into the store."""

from __future__ import annotations

from typing import Any

import click
from pydantic import ValidationError

from ingester.run import log_setup, run_one
from ingester.settings import IngestSettings
from shadow_ab.cli_support import explain


def load_settings(**overrides: Any) -> IngestSettings:
    """Settings from flags (non-None overrides), environment and env file, or a usage error."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return IngestSettings(**given)
    except ValidationError as exc:
        lines = explain(exc, where=_where)
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
    "--inflight-batches",
    "ingest_inflight_batches",
    type=int,
    help="Batches each worker writes at once while fetching the next (1: inline).",
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
    log_setup(verbose)
    settings = load_settings(**flags)
    if settings.ingest_workers > 1:
        from ingester.workers import run_workers

        raise SystemExit(run_workers(settings, verbose))
    run_one(settings)


_FLAGS = {
    "kafka_bootstrap": "--kafka",
    "database_url": "--database-url",
    "ingest_group": "--group",
    "ingest_batch_size": "--batch-size",
    "ingest_batch_timeout_ms": "--batch-timeout-ms",
    "ingest_workers": "--workers",
    "ingest_inflight_batches": "--inflight-batches",
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
