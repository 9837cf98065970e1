"""Every metric the ingester exports, declared once, with its type and meaning beside it.

Names follow Prometheus conventions (``_total`` for counters, ``_seconds`` for durations).
Served over HTTP by ``shadow-ab ingest --metrics-port P`` (0 = not served).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

CONSUMER_LAG = Gauge(
    "shadow_ab_ingest_consumer_lag",
    "Gauge. Messages in a partition not yet committed by this ingester: the partition's"
    " high-water mark minus the offset last committed (after the database commit).",
    ["topic", "partition"],
)
MESSAGES_CONSUMED = Counter(
    "shadow_ab_ingest_messages_consumed_total",
    "Counter. Messages taken from Kafka, good or poison, by source topic.",
    ["topic"],
)
PENDING_MESSAGES = Gauge(
    "shadow_ab_ingest_pending_messages",
    "Gauge. Messages taken from Kafka and held in batches not yet written to the store.",
)
BATCH_SIZE = Histogram(
    "shadow_ab_ingest_batch_size",
    "Histogram. Messages per flushed batch (records plus poison), observed once per batch.",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000),
)
BATCH_WRITE_SECONDS = Histogram(
    "shadow_ab_ingest_batch_write_seconds",
    "Histogram. Seconds for one successful store write of a batch (all its tables), retries"
    " excluded.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ROWS_WRITTEN = Counter(
    "shadow_ab_ingest_rows_written_total",
    "Counter. Rows newly inserted into the store, by table (exchanges, health_samples).",
    ["table"],
)
DUPLICATES_SKIPPED = Counter(
    "shadow_ab_ingest_duplicates_skipped_total",
    "Counter. Records already in the store (a replay or redelivery), by table; not rows lost.",
    ["table"],
)
DLQ_MESSAGES = Counter(
    "shadow_ab_ingest_dlq_messages_total",
    "Counter. Messages sent to the dead-letter topic, by reason code (see"
    " ingester.decode.PoisonReason).",
    ["reason"],
)
STORE_RETRIES = Counter(
    "shadow_ab_ingest_store_retries_total",
    "Counter. Failed attempts to write a batch that will be retried (store unreachable or"
    " dead-letter send not acknowledged), by cause.",
    ["cause"],
)
PAUSED = Gauge(
    "shadow_ab_ingest_paused",
    "Gauge. 1 while consumption is paused waiting for the store to come back, else 0.",
)
OFFSET_COMMIT_FAILURES = Counter(
    "shadow_ab_ingest_offset_commit_failures_total",
    "Counter. Kafka offset commits that failed after the store committed; they are retried,"
    " and meanwhile a restart would only re-read records that are skipped as duplicates.",
)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on ``host:port`` in a daemon thread; ``port`` 0 means do not serve."""
    if port:
        start_http_server(port, addr=host)
