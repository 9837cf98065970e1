"""The ingester's pipeline: small steps sharing one contract (getsentry/arroyo style).

    Decode ──► Accumulate (batch by size or age) ──► WriteBatch (DLQ, store) ──► CommitOffsets

Each step has ``submit(item)``, ``poll()``, ``join(timeout_s)`` and ``close()``:

- ``submit`` hands one item to the step. A step that cannot take it now raises
  :class:`MessageRejected` (backpressure); the caller keeps the item, pauses its partitions,
  and submits it again later. Nothing is buffered without bound.
- ``poll`` does time-driven work: flush a batch that is old enough, retry a failed write whose
  backoff has passed.
- ``join`` finishes everything pending (flush, write, commit) within ``timeout_s`` and says
  whether it did.
- ``close`` says no more items will come.

Offsets are committed only by the last step, after the store has committed the batch and
Kafka has acknowledged its dead letters.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from ingester import metrics
from ingester.backoff import Backoff
from ingester.batch import Batch, DeadLetter, Decoded, Message, Partition
from ingester.clients import Consumer
from ingester.clock import Clock
from ingester.decode import Poison, PoisonReason, decode
from ingester.errors import DeadLetterUnavailable, TransientError
from ingester.sink import StoreSink
from shadow_ab.records import Record
from storage.write import ExchangeRow

log = logging.getLogger(__name__)

T_contra = TypeVar("T_contra", contravariant=True)


class MessageRejected(Exception):  # arroyo's name; a backpressure signal, not a failure
    """Backpressure: the step cannot take this item now; keep it and submit it again later."""


class Step(Protocol[T_contra]):
    def submit(self, item: T_contra) -> None: ...
    def poll(self) -> None: ...
    def join(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...


@runtime_checkable
class Waits(Protocol):
    def wait(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for a write in flight to finish; False at once when
        none is running."""
        ...


class SendsDeadLetters(Protocol):
    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Send the letters not yet acknowledged; raise DeadLetterUnavailable on failure."""
        ...


class CommitOffsets:
    """Last step: commit the offsets of a batch the store has committed.

    A commit Kafka refuses (e.g. during a rebalance) is kept, merged with later ones and tried
    again on ``poll`` and ``join``; until then those records would merely be read again (and
    skipped as duplicates) after a restart. Offsets of partitions no longer assigned are
    dropped: their new owner reads from the committed offset.
    """

    def __init__(
        self,
        consumer: Consumer,
        on_committed: Callable[[dict[Partition, int]], None] | None = None,
        clock: Clock | None = None,
        retry_s: float = 1.0,
    ) -> None:
        self.consumer = consumer
        self.on_committed = on_committed
        self.clock = clock
        self.retry_s = retry_s
        self.committed: dict[Partition, int] = {}
        self.uncommitted: dict[Partition, int] = {}
        self._retry_at = 0.0

    def submit(self, offsets: dict[Partition, int]) -> None:
        for tp, off in offsets.items():
            self.uncommitted[tp] = max(off, self.uncommitted.get(tp, -1))
        self._commit()

    def poll(self) -> None:
        if self.uncommitted and self._now() >= self._retry_at:
            self._commit()

    def join(self, timeout_s: float) -> bool:
        if self.uncommitted:
            self._commit()
        return not self.uncommitted

    def close(self) -> None:
        pass

    def _now(self) -> float:
        return self.clock.monotonic() if self.clock is not None else 0.0

    def _commit(self) -> None:
        assigned = self.consumer.assignment()
        offsets = {tp: off for tp, off in self.uncommitted.items() if tp in assigned}
        if not offsets:
            self.uncommitted.clear()
            return
        try:
            self.consumer.commit(offsets)
        except Exception as exc:  # the clients raise several unrelated types here
            metrics.OFFSET_COMMIT_FAILURES.inc()
            self._retry_at = self._now() + self.retry_s
            log.warning("offset commit failed after the store committed (will retry): %r", exc)
            return
        self.uncommitted.clear()
        self.committed.update(offsets)
        if self.on_committed is not None:
            self.on_committed(offsets)
        for tp, off in offsets.items():
            self._update_lag(tp, off)

    def _update_lag(self, tp: Partition, committed: int) -> None:
        try:
            high = self.consumer.highwater(tp)
        except Exception:  # partition no longer assigned: no lag to report here
            return
        if high is not None:
            metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - committed))


class Runner(Protocol):
    """Where a batch write runs: inline (:class:`InlineRunner`, one batch at a time) or on
    writer threads (:class:`ThreadRunner`, several batches in flight: the store's COPY and
    commit of one batch overlap the next batches' fetch and decode)."""

    def submit(self, fn: Callable[[], None]) -> Future[None]: ...


class InlineRunner:
    """Runs the write at once, in the caller's thread."""

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        try:
            fn()
        except BaseException as exc:  # handed to the caller through the future
            future.set_exception(exc)
        else:
            future.set_result(None)
        return future


class ThreadRunner:
    """Runs writes on ``threads`` writer threads (each with its own store connection from the
    engine's pool); psycopg waits for the server without the GIL, so the processor's thread
    fetches and decodes meanwhile. Idle threads end with the process."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ingest-writer")

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        return self._pool.submit(fn)


@dataclass
class _Slot:
    """One batch handed to the writer and not yet handed on to the commit step."""

    batch: Batch
    future: Future[None] | None = None
    attempts: int = 0
    retry_at: float = 0.0
    written: bool = False


class WriteBatch:
    """Write a batch's records, send its dead letters, then hand its offsets on.

    Up to ``max_inflight`` batches at a time (written by ``runner``: inline, one at a time, or
    on writer threads). When that many are being written or waiting to be retried, ``submit``
    raises :class:`MessageRejected`, so the caller pauses consumption instead of piling up
    batches. While the store is away (:class:`~ingester.errors.TransientError`) a batch is
    retried with backoff on ``poll``. Offsets are handed on only after a successful write, and
    in the order the batches came: a batch written early waits for the ones before it, so a
    committed offset never passes a record that is not in the store.
    """

    def __init__(
        self,
        sink: StoreSink,
        dead_letters: SendsDeadLetters,
        next_step: Step[dict[Partition, int]],
        clock: Clock,
        backoff: Backoff,
        runner: Runner | None = None,
        max_inflight: int = 1,
    ) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.sink = sink
        self.dead_letters = dead_letters
        self.next_step = next_step
        self.clock = clock
        self.backoff = backoff
        self.runner: Runner = runner or InlineRunner()
        self.max_inflight = max_inflight
        self.slots: deque[_Slot] = deque()
        self._paused_shown = True
        """Whether the paused gauge may show 1 (set to 0 on the first check, then only after a
        retry set it: a gauge update on every check cost as much as the rest of it)."""

    @property
    def busy(self) -> bool:
        """Whether ``submit`` would refuse a batch now."""
        return len(self.slots) >= self.max_inflight

    def has_room(self) -> bool:
        """Whether ``submit`` may take a batch now: a slot is free, or the oldest batch's write
        has finished (``submit`` then hands it on first). Cheap, for a caller asking once a
        message."""
        if len(self.slots) < self.max_inflight:
            return True
        future = self.slots[0].future
        return future is not None and future.done()

    @property
    def pending_messages(self) -> int:
        """Messages in batches handed to the writer and not yet handed on."""
        return sum(slot.batch.size for slot in self.slots)

    @property
    def pending(self) -> Batch | None:
        """The oldest batch not yet handed on (the one the next commit waits for)."""
        return self.slots[0].batch if self.slots else None

    @property
    def attempts(self) -> int:
        """Failed attempts so far to write the oldest batch."""
        return self.slots[0].attempts if self.slots else 0

    @property
    def retry_at(self) -> float:
        """When the oldest batch is retried (the clock's time; 0 when it is not waiting)."""
        return self.slots[0].retry_at if self.slots else 0.0

    def submit(self, batch: Batch) -> None:
        self._check()
        if len(self.slots) >= self.max_inflight:
            raise MessageRejected()
        slot = _Slot(batch)
        self.slots.append(slot)
        self._start(slot)
        self._check()

    def poll(self) -> None:
        self._check()
        now = self.clock.monotonic()
        for slot in self.slots:
            if not slot.written and slot.future is None and now >= slot.retry_at:
                self._start(slot)
        self._check()
        self.next_step.poll()

    def join(self, timeout_s: float) -> bool:
        deadline = self.clock.monotonic() + timeout_s
        while self.slots:
            now = self.clock.monotonic()
            if now >= deadline:
                return False
            running = [s.future for s in self.slots if s.future is not None]
            if running:
                wait(running, timeout=deadline - now, return_when=FIRST_COMPLETED)
                self._check()
                continue
            due = min(s.retry_at for s in self.slots if not s.written)
            if now < due:
                self.clock.sleep(min(due, deadline) - now)
                continue
            for slot in self.slots:
                if not slot.written and now >= slot.retry_at:
                    self._start(slot)
            self._check()
        return self.next_step.join(max(0.0, deadline - self.clock.monotonic()))

    def close(self) -> None:
        self.next_step.close()

    def wait(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until a write in flight finishes, so the caller can
        wait for room instead of pausing its partitions. False at once when no write is
        running (the batches wait out a retry's backoff, or writes are inline): only time
        helps then, and the caller pauses."""
        running = [slot.future for slot in self.slots if slot.future is not None]
        if not running:
            return False
        wait(running, timeout=timeout_s, return_when=FIRST_COMPLETED)
        return True

    def _start(self, slot: _Slot) -> None:
        if slot.future is not None or slot.written:
            return
        batch = slot.batch
        slot.future = self.runner.submit(lambda: self._timed_write(batch))

    def _timed_write(self, batch: Batch) -> None:
        started = self.clock.monotonic()
        self._write(batch)
        metrics.BATCH_WRITE_SECONDS.observe(self.clock.monotonic() - started)

    def _check(self) -> None:
        """Act on finished writes (schedule a retry, or raise), then hand on the offsets of the
        written batches at the head of the line."""
        for slot in self.slots:
            future = slot.future
            if future is None or not future.done():
                continue
            slot.future = None
            exc = future.exception()
            if isinstance(exc, TransientError):
                slot.attempts += 1
                delay = self.backoff.delay(slot.attempts)
                slot.retry_at = self.clock.monotonic() + delay
                cause = "dlq" if isinstance(exc, DeadLetterUnavailable) else "store"
                metrics.STORE_RETRIES.labels(cause=cause).inc()
                metrics.PAUSED.set(1)
                self._paused_shown = True
                log.warning(
                    "batch of %d not written (attempt %d, %s); retrying in %.2fs: %s",
                    slot.batch.size,
                    slot.attempts,
                    type(exc).__name__,
                    delay,
                    exc,
                )
                continue
            if exc is not None:
                raise exc
            slot.written = True
            metrics.BATCH_SIZE.observe(slot.batch.size)
            if slot.attempts:
                log.info(
                    "store is back: batch of %d written after %d retries",
                    slot.batch.size,
                    slot.attempts,
                )
        while self.slots and self.slots[0].written:
            done = self.slots.popleft()
            self.next_step.submit(done.batch.offsets)
        if self._paused_shown and not any(s.attempts and not s.written for s in self.slots):
            metrics.PAUSED.set(0)
            self._paused_shown = False

    def _write(self, batch: Batch) -> None:
        # The store first, then every dead letter of the batch (poison and records the store
        # refused) in one go, then the offsets: if Kafka will not take the dead letters, nothing
        # is committed and the batch is retried (the store writes are done and not repeated).
        # Sending them last keeps the window in which a crash re-sends them to the moment
        # between Kafka's acknowledgement and the offset commit; a store outage, or a store
        # that refuses the whole batch (StoreRejected stops the process), sends none.
        if not batch.exchanges_done:
            self._write_table(batch, "exchanges", batch.exchanges, batch.exchange_messages)
            batch.exchanges_done = True
        if not batch.health_done:
            self._write_table(batch, "health_samples", batch.health, batch.health_messages)
            batch.health_done = True
        self.dead_letters.send(batch.dead_letters)

    def _write_table(
        self, batch: Batch, table: str, records: list[Any], messages: list[Message]
    ) -> None:
        if not records:
            return
        if table == "exchanges":
            written = self.sink.write_exchanges(records)
        else:
            written = self.sink.write_health(records)
        metrics.ROWS_WRITTEN.labels(table=table).inc(written.inserted)
        stored = len(records) - len(written.rejected)
        metrics.DUPLICATES_SKIPPED.labels(table=table).inc(max(0, stored - written.inserted))
        for index, reason in written.rejected:
            poison = Poison(PoisonReason.STORE_REJECTED, reason)
            batch.dead_letters.append(DeadLetter(messages[index], poison))


class Accumulate:
    """Collect decoded messages into a batch; hand it on when it is full or old enough."""

    def __init__(
        self, next_step: WriteBatch, clock: Clock, max_size: int, max_wait_s: float
    ) -> None:
        if max_size < 1 or max_wait_s <= 0:
            raise ValueError(
                f"batch needs max_size >= 1 and max_wait_s > 0, got {max_size}, {max_wait_s}"
            )
        self.next_step = next_step
        self.clock = clock
        self.max_size = max_size
        self.max_wait_s = max_wait_s
        self.current: Batch | None = None
        self.ready: Batch | None = None
        """A complete batch the next step would not take yet (while ``current`` fills up)."""
        self._consumed: dict[str, Any] = {}
        self._unreported: dict[str, int] = {}
        """Messages taken per topic since the metrics were last updated: the metrics move once
        a batch and on every ``poll`` (the processor's every step), not once a message (two
        Prometheus updates and the pending count cost as much as a tenth of decoding one)."""
        metrics.PENDING_MESSAGES.set(0)

    def submit(self, item: Decoded) -> None:
        if self.ready is not None and self.next_step.has_room():
            self._hand_on()
        if self.current is not None and self.current.size >= self.max_size:
            # Full, and the batch before it is still waiting for the writer: push back.
            self._seal()
            if self.current is not None:
                raise MessageRejected()
        if self.current is None:
            self.current = Batch(started_at=self.clock.monotonic())
        self.current.add(item)
        topic = item.message.topic
        self._unreported[topic] = self._unreported.get(topic, 0) + 1
        if self.current.size >= self.max_size:
            self._seal()
            self._report()

    def poll(self) -> None:
        self.next_step.poll()
        if self.ready is not None:
            self._hand_on()
        if self.current is not None and (
            self.current.size >= self.max_size
            or self.clock.monotonic() - self.current.started_at >= self.max_wait_s
        ):
            self._seal()
        self._report()

    def join(self, timeout_s: float) -> bool:
        deadline = self.clock.monotonic() + timeout_s
        self._seal()
        while self.ready is not None or self.current is not None:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0 or not self.next_step.join(remaining):
                self._report()
                return False
            self._seal()
        done = self.next_step.join(max(0.0, deadline - self.clock.monotonic()))
        self._report()
        return done

    def close(self) -> None:
        self.next_step.close()

    def wait(self, timeout_s: float) -> bool:
        """:meth:`WriteBatch.wait`: until a write in flight finishes."""
        return self.next_step.wait(timeout_s)

    @property
    def pending_messages(self) -> int:
        """Messages here and in the writer that are not written yet."""
        batches = (self.current, self.ready)
        return sum(b.size for b in batches if b is not None) + self.next_step.pending_messages

    def _report(self) -> None:
        for topic, taken in self._unreported.items():
            counter = self._consumed.get(topic)
            if counter is None:  # labels() costs 4x the inc(): look it up once per topic
                counter = self._consumed[topic] = metrics.MESSAGES_CONSUMED.labels(topic=topic)
            counter.inc(taken)
        self._unreported.clear()
        metrics.PENDING_MESSAGES.set(self.pending_messages)

    def _seal(self) -> None:
        """Hand on the ready batch, then make the current one ready and try to hand it on."""
        self._hand_on()
        if self.ready is None and self.current is not None:
            self.ready, self.current = self.current, None
            self._hand_on()

    def _hand_on(self) -> None:
        if self.ready is None:
            return
        try:
            self.next_step.submit(self.ready)
        except MessageRejected:
            return
        self.ready = None


class Decode:
    """First step: turn a raw message into a record or a :class:`Poison` and pass it on."""

    def __init__(
        self,
        next_step: Step[Decoded],
        expected_kinds: dict[str, str],
        *,
        fast: bool = True,
        rows: bool = False,
    ) -> None:
        self.next_step = next_step
        self.expected_kinds = expected_kinds
        """topic -> record kind allowed on it ("exchange" or "health")."""
        self.fast = fast
        """Try the msgspec decoder first (:mod:`ingester.fastdecode`); pydantic alone if not."""
        self.rows = rows
        """With ``fast``: exchanges straight to their store rows (``storage.write.ExchangeRow``)."""

    def submit(self, message: Message) -> None:
        kind = self.expected_kinds.get(message.topic)
        try:
            result: Record | ExchangeRow | Poison = decode(
                message.value, kind, fast=self.fast, rows=self.rows
            )
        except Exception as exc:  # a bug a message trips: that message alone is poison
            log.exception("decoding a message at %s/%d@%d failed", *_where(message))
            result = Poison(PoisonReason.DECODE_FAILED, f"{type(exc).__name__}: {exc}")
        self.next_step.submit(Decoded(message, result))

    def poll(self) -> None:
        self.next_step.poll()

    def join(self, timeout_s: float) -> bool:
        return self.next_step.join(timeout_s)

    def close(self) -> None:
        self.next_step.close()

    def wait(self, timeout_s: float) -> bool:
        """The next step's ``wait`` (:meth:`WriteBatch.wait`), if it has one."""
        return isinstance(self.next_step, Waits) and self.next_step.wait(timeout_s)


def _where(message: Message) -> tuple[str, int, int]:
    return message.topic, message.partition, message.offset


__all__ = [
    "Accumulate",
    "CommitOffsets",
    "Decode",
    "InlineRunner",
    "MessageRejected",
    "Step",
    "ThreadRunner",
    "Waits",
    "WriteBatch",
]
