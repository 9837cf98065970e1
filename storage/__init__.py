"""The store: schema, migrations, daily partitions and retention, bulk idempotent writers, and
the direct sink. The README's section "The store" documents the tables for people who query
them with SQL.

Public surface (the ingester and the mirror use exactly these)::

    make_engine(url) -> Engine                       storage.db
    upgrade(url, revision="head")                     storage.migrate
    write_exchanges(engine, records) -> int           storage.write (rows newly inserted)
    write_health(engine, samples) -> int
    write_drops(engine, source, reason, count, ts)
    ensure_partitions(engine, start, days_ahead)      storage.partitions
    apply_retention(engine, keep_days, dry_run=...)
    DirectSink(engine, batch_size=..., flush_interval_s=..., max_queue=...)   storage.sink
    StorageError > StoreUnavailable (retry) | StoreError (permanent)          storage.errors

Importing :mod:`storage` does not import the sink (and its Prometheus metrics) or Alembic;
import ``storage.sink`` / ``storage.migrate`` for those.
"""

from storage.db import make_engine
from storage.errors import (
    BadConfiguration,
    SchemaMissing,
    StorageError,
    StoreError,
    StoreUnavailable,
)
from storage.partitions import apply_retention, ensure_partitions
from storage.write import write_drops, write_exchanges, write_health, write_records

__all__ = [
    "BadConfiguration",
    "SchemaMissing",
    "StorageError",
    "StoreError",
    "StoreUnavailable",
    "apply_retention",
    "ensure_partitions",
    "make_engine",
    "write_drops",
    "write_exchanges",
    "write_health",
    "write_records",
]
