"""Where the mirror's records go: the :class:`RecordSink` protocol and :func:`open_sink`.

Two sinks satisfy the protocol:

- :class:`mirror.kafka_sink.KafkaSink` (at scale): records to Kafka, with an on-disk spool
  while the broker is away;
- :class:`storage.sink.DirectSink` (embedded default): records straight into the store
  (SQLite file by default, or PostgreSQL).

Both never block ``submit``: it returns False when the record had to be dropped (counted).

Errors::

    ValueError                              the database URL's dialect is not supported
    storage.errors.StorageError             the embedded store could not be migrated
    mirror.errors.KafkaSinkError            the Kafka sink's spool folder is unusable
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol, runtime_checkable

from mirror.kafka_sink import KafkaSink, KafkaSinkConfig
from shadow_ab.records import Record
from shadow_ab.settings import default_sqlite_url, normalize_database_url, state_dir
from storage.db import make_engine, redact_url
from storage.sink import DirectSink

log = logging.getLogger(__name__)

DIRECT_LEDGER = "mirror-direct-sink.ledger"


@runtime_checkable
class RecordSink(Protocol):
    """What the mirror and the health sampler hand their records to."""

    label: str
    """The sink's name in the mirror's metrics (label ``sink``): ``kafka`` for a sink that
    counts its own records (``shadow_ab_mirror_records_total``), ``direct`` for one the mirror
    counts them for."""

    def submit(self, record: Record) -> bool:
        """Accept ``record`` without blocking; False when it was dropped (and counted)."""
        ...

    def flush(self, timeout: float = 30.0) -> bool:
        """Deliver everything accepted so far; True when nothing is left pending."""
        ...

    def close(self, timeout: float = 30.0) -> bool:
        """Stop accepting, deliver what is pending, release resources; True when nothing was
        lost."""
        ...


def sink_alive(sink: RecordSink) -> bool:
    """Whether the sink's background thread is running (a sink without ``alive()`` is)."""
    alive = getattr(sink, "alive", None)
    return bool(alive()) if callable(alive) else True


def open_sink(
    *,
    kafka: KafkaSinkConfig | None,
    database_url: str | None,
    direct_queue_max_bytes: int = 256 * 1024**2,
) -> RecordSink:
    """The Kafka sink when ``kafka`` is given, else a direct sink on ``database_url``.

    With neither, the embedded default: the SQLite file of :mod:`shadow_ab.settings`. A SQLite
    store is migrated to the newest schema first, so the demo works out of the box; a PostgreSQL
    store must have been migrated with ``shadow-ab db upgrade``. The direct sink keeps its
    ledger of accepted records (what a SIGKILL loses, counted at the next start) in the state
    folder (``DIRECT_LEDGER``); the Kafka sink keeps its own in its spool folder.
    """
    if kafka is not None:
        return KafkaSink(kafka)
    url = normalize_database_url(database_url or default_sqlite_url())
    if url.startswith("sqlite"):
        _migrate_sqlite(url)
    log.info("records go straight to the store at %s", redact_url(url))
    return DirectSink(
        make_engine(url),
        source="mirror",
        max_queue_bytes=direct_queue_max_bytes,
        ledger_path=state_dir() / DIRECT_LEDGER,
    )


def _migrate_sqlite(url: str) -> None:
    from storage import migrate

    path = url.split("sqlite:///", 1)[1] if url.startswith("sqlite:///") else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(url)
