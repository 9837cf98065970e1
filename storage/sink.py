"""The direct sink: records from the mirror go straight into the store, in batches.

The embedded default (no Kafka): the mirror calls :meth:`DirectSink.submit` on its request path,
which never blocks -- the record goes into an in-memory queue bounded by records (``max_queue``)
and by bytes (``max_queue_bytes``, :func:`storage.bounds.approx_bytes`), or, when the queue is
full, is dropped and counted (Prometheus ``shadow_ab_sink_dropped_total`` and, once the store
answers again, a row in the ``drops`` table). A background thread takes batches off the queue
and writes them with :func:`storage.write.write_exchanges` / :func:`storage.write.write_health`:

- a batch is written as soon as ``batch_size`` records are queued, or when the oldest queued
  record has waited ``flush_interval_s`` (measured on the injectable ``clock``);
- while the store is unavailable (:class:`~storage.errors.StoreUnavailable`) the same batch is
  retried with exponential backoff; the queue meanwhile fills and then drops, counted;
- a permanent :class:`~storage.errors.StoreError` is narrowed down by halving the batch: only
  the records the store refuses are dropped, counted and logged (a missing schema drops the
  batch: run ``shadow-ab db upgrade`` before starting the mirror);
- :meth:`DirectSink.close` flushes everything, retrying until its timeout; records it could not
  write are counted as dropped (reason ``store_unavailable``) and logged.
- with ``ledger_path``, the records accepted and not yet written or counted are kept count of
  in a :class:`storage.bounds.Ledger`: a process killed with SIGKILL loses its queue, and the
  next sink on that ledger counts those records as dropped (reason ``killed``, a row in the
  ``drops`` table).

Lifecycle: ``submit`` / ``flush`` / ``close`` (also a context manager).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from sqlalchemy import Engine

from shadow_ab.records import ExchangeRecord, HealthSample, Record
from storage.bounds import KILLED, approx_bytes, open_ledger
from storage.errors import BadConfiguration, SchemaMissing, StoreError, StoreUnavailable
from storage.metrics import SINK_DROPPED, SINK_QUEUE, SINK_RETRIES, SINK_SUBMITTED, SINK_WRITTEN
from storage.write import write_drops, write_exchanges, write_health

log = logging.getLogger(__name__)

# Drop reasons (label values of shadow_ab_sink_dropped_total, ``reason`` in the drops table).
QUEUE_FULL = "queue_full"
CLOSED = "closed"
STORE_UNAVAILABLE = "store_unavailable"
STORE_ERROR = "store_error"
WRITER_ERROR = "writer_error"


@dataclass
class SinkStats:
    """Counts of one sink since it started (the Prometheus counters add up all sinks)."""

    submitted: int = 0
    written: int = 0
    """Rows newly inserted."""
    duplicates: int = 0
    """Records written but already in the store (a replay), so not inserted again."""
    batches: int = 0
    retries: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


class DirectSink:
    """Batches records into the store from a background thread; ``submit`` never blocks."""

    label = "direct"
    """Its name in the mirror's metrics (``mirror.sinks.RecordSink.label``)."""

    def __init__(
        self,
        engine: Engine,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 1.0,
        max_queue: int = 50_000,
        max_queue_bytes: int = 256 * 1024**2,
        ledger_path: Path | None = None,
        source: str = "direct_sink",
        clock: Callable[[], float] = time.monotonic,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        poll_s: float = 0.05,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_queue < batch_size:
            raise ValueError(f"max_queue ({max_queue}) must be >= batch_size ({batch_size})")
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        self.engine = engine
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.source = source
        self._clock = clock
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._poll_s = poll_s

        self._cond = threading.Condition()
        self._queue: deque[tuple[Record, int]] = deque()  # (record, approx_bytes)
        self._queue_bytes = 0
        self._oldest_at: float | None = None  # clock() when the oldest queued record arrived
        self._inflight = 0
        self._flush_requested = False
        self._closing = False
        self._deadline: float | None = None  # time.monotonic() by which close() gives up
        self._pending_drops: Counter[str] = Counter()  # not yet written to the drops table
        self._stats = SinkStats()
        self._ledger = open_ledger(ledger_path) if ledger_path is not None else None
        if self._ledger is not None:
            killed = self._ledger.take_unsettled()
            if killed:
                log.warning(
                    "the previous process on %s ended with %d records accepted and not written"
                    " (killed?): counted as dropped (killed)",
                    ledger_path,
                    killed,
                )
                self._drop(KILLED, killed)
        self._thread = threading.Thread(target=self._run, name="shadow-ab-direct-sink", daemon=True)
        self._thread.start()

    # -- request path -------------------------------------------------------------------------

    def submit(self, record: Record) -> bool:
        """Queue ``record`` for writing; False (and counted) when it had to be dropped."""
        if not isinstance(record, ExchangeRecord | HealthSample):
            raise TypeError(f"DirectSink takes ExchangeRecord or HealthSample, not {record!r}")
        with self._cond:
            if self._closing:
                self._drop(CLOSED, 1)
                return False
            size = approx_bytes(record)
            if (
                len(self._queue) >= self.max_queue
                or self._queue_bytes + size > self.max_queue_bytes
            ):
                self._drop(QUEUE_FULL, 1)
                return False
            if not self._queue:
                self._oldest_at = self._clock()
                self._cond.notify_all()
            self._queue.append((record, size))
            self._queue_bytes += size
            self._stats.submitted += 1
            if self._ledger is not None:
                self._ledger.accept()
            if len(self._queue) == self.batch_size:
                self._cond.notify_all()
        SINK_SUBMITTED.labels(kind=record.kind).inc()
        SINK_QUEUE.inc()
        return True

    # -- control ------------------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Write everything queued now; True when the queue is empty and nothing is in flight."""
        end = time.monotonic() + timeout
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            try:
                while self._queue or self._inflight:
                    remaining = end - time.monotonic()
                    if remaining <= 0 or not self._thread.is_alive():
                        return False
                    self._cond.wait(min(remaining, self._poll_s))
                return True
            finally:
                self._flush_requested = False

    def close(self, timeout: float = 30.0) -> bool:
        """Stop accepting records, write everything queued (retrying up to ``timeout``
        seconds) and stop the thread. True when every accepted record was written."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        self._thread.join(timeout + 5.0)
        if self._ledger is not None and not self._thread.is_alive():
            self._ledger.close()
        with self._cond:
            unwritten = len(self._queue) + self._inflight
            # Records refused by submit() (queue full, closed) were never accepted.
            lost = sum(
                n for reason, n in self._stats.dropped.items() if reason not in (QUEUE_FULL, CLOSED)
            )
        return not self._thread.is_alive() and unwritten == 0 and lost == 0

    def alive(self) -> bool:
        """False when the writer thread died (records would pile up unwritten): liveness."""
        return self._thread.is_alive() or self._closing

    def pending(self) -> tuple[int, int]:
        """(records queued, records being written now)."""
        with self._cond:
            return len(self._queue), self._inflight

    def stats(self) -> SinkStats:
        with self._cond:
            return SinkStats(
                submitted=self._stats.submitted,
                written=self._stats.written,
                duplicates=self._stats.duplicates,
                batches=self._stats.batches,
                retries=self._stats.retries,
                dropped=Counter(self._stats.dropped),
            )

    def __enter__(self) -> DirectSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writer thread ------------------------------------------------------------------------

    def _drop(self, reason: str, count: int) -> None:
        """Count dropped records (caller holds the lock)."""
        self._stats.dropped[reason] += count
        self._pending_drops[reason] += count
        SINK_DROPPED.labels(reason=reason).inc(count)

    def _due(self) -> bool:
        if not self._queue:
            return False
        if len(self._queue) >= self.batch_size or self._closing or self._flush_requested:
            return True
        return self._oldest_at is not None and (
            self._clock() - self._oldest_at >= self.flush_interval_s
        )

    def _take_batch(self) -> list[Record] | None:
        """Wait for a batch to be due; None when closing and nothing is left."""
        with self._cond:
            while not self._due():
                if self._closing and not self._queue:
                    return None
                self._cond.wait(self._poll_s)
            n = min(self.batch_size, len(self._queue))
            taken = [self._queue.popleft() for _ in range(n)]
            batch = [record for record, _size in taken]
            self._queue_bytes -= sum(size for _record, size in taken)
            self._inflight = n
            self._oldest_at = self._clock() if self._queue else None
        SINK_QUEUE.dec(n)
        return batch

    def _run(self) -> None:
        self._write_pending_drops()  # a killed predecessor's count, at once
        while True:
            batch = self._take_batch()
            if batch is None:
                break
            self._write_batch(batch)
            with self._cond:
                self._inflight = 0
                self._cond.notify_all()
            self._write_pending_drops()
        self._write_pending_drops()

    def _give_up(self) -> bool:
        return self._closing and self._deadline is not None and time.monotonic() >= self._deadline

    def _write_batch(self, batch: list[Record]) -> None:
        """Write one batch; a permanent error is narrowed down by halving the batch, so one
        record the store refuses does not take the others with it."""
        try:
            self._write_retrying(batch)
        except (SchemaMissing, BadConfiguration) as exc:
            log.error("store cannot take records, dropping %d: %s", len(batch), exc)
            self._count_drop(STORE_ERROR, len(batch))
        except StoreError as exc:
            if len(batch) == 1:
                log.error("store refused a record, dropping it: %s", exc)
                self._count_drop(STORE_ERROR, 1)
                return
            mid = len(batch) // 2
            self._write_batch(batch[:mid])
            self._write_batch(batch[mid:])
        except Exception:
            log.exception("direct sink failed to write a batch, dropping %d records", len(batch))
            self._count_drop(WRITER_ERROR, len(batch))

    def _write_retrying(self, batch: list[Record]) -> None:
        exchanges = [r for r in batch if isinstance(r, ExchangeRecord)]
        health = [r for r in batch if isinstance(r, HealthSample)]
        delay = self._backoff_initial_s
        while True:
            try:
                new_x = write_exchanges(self.engine, exchanges) if exchanges else 0
                new_h = write_health(self.engine, health) if health else 0
                break
            except StoreUnavailable as exc:
                if self._give_up():
                    log.error(
                        "store still unavailable at close, dropping %d records: %s",
                        len(batch),
                        exc,
                    )
                    self._count_drop(STORE_UNAVAILABLE, len(batch))
                    return
                with self._cond:
                    self._stats.retries += 1
                SINK_RETRIES.inc()
                log.warning(
                    "store unavailable, retrying %d records in %.1fs: %s", len(batch), delay, exc
                )
                self._sleep(delay)
                delay = min(delay * 2, self._backoff_max_s)
        if self._ledger is not None:
            self._ledger.settle(len(batch))
        with self._cond:
            self._stats.batches += 1
            self._stats.written += new_x + new_h
            self._stats.duplicates += len(batch) - new_x - new_h
        SINK_WRITTEN.labels(kind="exchange").inc(new_x)
        SINK_WRITTEN.labels(kind="health").inc(new_h)

    def _sleep(self, seconds: float) -> None:
        """Back off, waking early when close() is called (its deadline still applies)."""
        end = time.monotonic() + seconds
        with self._cond:
            while not self._give_up():
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(min(remaining, self._poll_s))

    def _count_drop(self, reason: str, count: int) -> None:
        """Count accepted records the thread gives up on (settled: counted, not pending)."""
        if self._ledger is not None:
            self._ledger.settle(count)
        with self._cond:
            self._drop(reason, count)

    def _write_pending_drops(self) -> None:
        with self._cond:
            pending = dict(self._pending_drops)
            self._pending_drops.clear()
        if not pending:
            return
        now = datetime.now(UTC)
        for reason, count in pending.items():
            try:
                write_drops(self.engine, self.source, reason, count, now)
            except Exception as exc:  # keep the count for the next attempt; never lose it
                log.warning("could not record %d dropped records (%s): %s", count, reason, exc)
                with self._cond:
                    self._pending_drops[reason] += count
