"""Writing records to the store, with storage's errors translated at this one boundary.

The store's writers (``storage.write``) are injected so the ingester can be driven by the real
PostgreSQL in tests and by the same code in production. Each write call is one transaction and
idempotent, so retrying a whole batch after a failure never duplicates rows.

A batch the store refuses for a reason that waiting will not fix is bisected: records the store
accepts are written, single records it refuses come back as rejects for the dead-letter topic.
That is a ``StoreError`` (its sibling ``StoreUnavailable`` is the transient one, retried) or any
other exception a record provokes in the writers (an ``OverflowError``, a ``ValueError``, a bug
that one value trips): one bad record never takes its batch with it, and never crash-loops the
ingester. If the store refuses every record, the problem is the store (or the code), not the
data: :class:`~ingester.errors.StoreRejected` stops the process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ingester.errors import StoreDown, StoreRejected

if TYPE_CHECKING:
    from sqlalchemy import Engine

T = TypeVar("T")
Writer = Callable[[Any, Sequence[T]], int]


@dataclass
class Written:
    """What one write did: rows newly inserted, and records the store refused (with why)."""

    inserted: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    """(index into the records written, the store's reason) for each record refused."""


class StoreSink:
    """Writes exchanges and health samples through ``storage.write``."""

    def __init__(
        self,
        engine: Engine,
        write_exchanges: Writer[Any] | None = None,
        write_health: Writer[Any] | None = None,
    ) -> None:
        from storage import errors as storage_errors

        if write_exchanges is None or write_health is None:
            from storage import write as storage_write

            write_exchanges = write_exchanges or storage_write.write_exchanges
            write_health = write_health or storage_write.write_health
        self.engine = engine
        self._write_exchanges = write_exchanges
        self._write_health = write_health
        self._unavailable: type[Exception] = storage_errors.StoreUnavailable
        # Errors about the store itself, not about a record: no point bisecting the batch.
        self._systemic: tuple[type[Exception], ...] = (
            storage_errors.SchemaMissing,
            storage_errors.BadConfiguration,
        )

    def write_exchanges(self, records: Sequence[Any]) -> Written:
        return self._write(self._write_exchanges, records, "exchanges")

    def write_health(self, samples: Sequence[Any]) -> Written:
        return self._write(self._write_health, samples, "health_samples")

    def _write(self, writer: Writer[Any], records: Sequence[Any], table: str) -> Written:
        if not records:
            return Written()
        try:
            return Written(inserted=self._call(writer, records))
        except StoreDown:
            raise
        except Exception as exc:  # StoreError, or anything a record trips in the writers
            if isinstance(exc, self._systemic):
                raise StoreRejected(str(exc)) from exc
            first_error = _describe(exc)
        written = self._bisect(writer, records, 0)
        if len(written.rejected) == len(records):
            raise StoreRejected(
                f"the store refused every one of {len(records)} {table} records ({first_error});"
                " if the tables are missing run `shadow-ab db upgrade`"
            )
        return written

    def _call(self, writer: Writer[Any], records: Sequence[Any]) -> int:
        try:
            return writer(self.engine, records)
        except self._unavailable as exc:
            raise StoreDown(str(exc)) from exc

    def _bisect(self, writer: Writer[Any], records: Sequence[Any], base: int) -> Written:
        if len(records) == 1:
            try:
                return Written(inserted=self._call(writer, records))
            except StoreDown:
                raise
            except Exception as exc:
                return Written(rejected=[(base, _describe(exc))])
        mid = len(records) // 2
        out = Written()
        for start, half in ((0, records[:mid]), (mid, records[mid:])):
            try:
                out.inserted += self._call(writer, half)
            except StoreDown:
                raise
            except Exception:
                sub = self._bisect(writer, half, base + start)
                out.inserted += sub.inserted
                out.rejected.extend(sub.rejected)
        return out


def _describe(exc: BaseException) -> str:
    """The store's sentence for its own errors; the type too for anything else."""
    from storage.errors import StorageError

    return str(exc) if isinstance(exc, StorageError) else f"{type(exc).__name__}: {exc}"
