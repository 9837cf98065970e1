"""Prometheus metrics of the storage part, declared once, each with its type and meaning.

| name | type | labels | meaning |
|---|---|---|---|
| shadow_ab_sink_submitted_total | counter | kind | records the direct sink accepted into its queue |
| shadow_ab_sink_dropped_total | counter | reason | records the direct sink dropped (queue_full, closed, store_unavailable, store_error, writer_error); also written to the ``drops`` table |
| shadow_ab_sink_written_total | counter | kind | rows the direct sink newly inserted (duplicates not counted) |
| shadow_ab_sink_store_retries_total | counter | | write attempts that failed with StoreUnavailable and were retried |
| shadow_ab_sink_queue_records | gauge | | records waiting in the direct sink's queue |
"""  # noqa: E501 (a table reads better unwrapped)

from __future__ import annotations

from prometheus_client import Counter, Gauge

SINK_SUBMITTED = Counter(
    "shadow_ab_sink_submitted_total",
    "Records the direct sink accepted into its queue.",
    ["kind"],
)
SINK_DROPPED = Counter(
    "shadow_ab_sink_dropped_total",
    "Records the direct sink dropped, by reason (also written to the drops table).",
    ["reason"],
)
SINK_WRITTEN = Counter(
    "shadow_ab_sink_written_total",
    "Rows the direct sink newly inserted into the store (duplicates not counted).",
    ["kind"],
)
SINK_RETRIES = Counter(
    "shadow_ab_sink_store_retries_total",
    "Direct sink write attempts that failed with StoreUnavailable and were retried.",
)
SINK_QUEUE = Gauge(
    "shadow_ab_sink_queue_records",
    "Records waiting in the direct sink's queue.",
)
