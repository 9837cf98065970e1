"""The loop that feeds Kafka messages into the steps and keeps the consumer group alive.

It polls the consumer, submits each message to the first step, and on
:class:`~ingester.steps.MessageRejected` keeps the rest of that poll's messages. While a batch
write is running it waits for that write (``wait_for_writer``), without polling, for up to
:data:`WAIT_FOR_WRITER_S` in a row: the batches in flight are the back-pressure, and the
consumer keeps what it prefetched (librdkafka throws away the prefetched messages of a paused
partition and fetches them again on resume: ``bench/ingest.py`` measured a poll of 1,000 at
394-670 ms after a pause and resume, 30-40 ms without, longer than writing the batches in
flight takes, so the writers went idle). When no write is running (the store is away: the
batch waits out its retry's backoff) or the wait has lasted that long, it pauses every
assigned partition and polls on (briefly, every ``PAUSED_POLL_MS``) to keep the group
membership and serve rebalances, and resumes once the steps take messages again.
Heartbeats run on the clients' own threads; ``max.poll.interval.ms`` (5 minutes) is far above
the wait.

A rebalance changes nothing in flight: what was taken is still written (writes are
idempotent), and offsets are committed only for partitions still assigned when the write is
done (see :class:`~ingester.steps.CommitOffsets`), so a partition that moved to another
ingester is read again by it from its committed offset, and nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ingester.batch import Message, Partition
from ingester.clients import Consumer
from ingester.clock import Clock
from ingester.errors import SettingsError
from ingester.steps import MessageRejected, Step, Waits

log = logging.getLogger(__name__)

PAUSED_POLL_MS = 10
"""Poll timeout while paused: how often a finished write is noticed (sleeps, no busy loop)."""

WAIT_FOR_WRITER_S = 5.0
"""How long in a row the processor waits for running writes without polling Kafka before it
pauses its partitions and polls on (rebalances wait that long at most)."""


class StreamProcessor:
    def __init__(
        self,
        consumer: Consumer,
        topics: list[str],
        make_steps: Callable[[], Step[Message]],
        clock: Clock,
        *,
        max_records: int,
        poll_timeout_ms: int = 500,
    ) -> None:
        self.consumer = consumer
        self.topics = topics
        self.clock = clock
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.steps: Step[Message] = make_steps()
        self.held: list[Message] = []
        """Messages polled but not yet taken by the steps (at most one poll's worth)."""
        self.paused = False
        self._waiting_since: float | None = None
        """When the steps' back-pressure began, while it is met by waiting for a write."""
        self._stopping = False
        self.taken = 0
        """Messages taken from Kafka so far."""
        self.committed_offsets: dict[Partition, int] = {}
        """Per partition, the last offset this processor committed."""

    # -- lifecycle -------------------------------------------------------------------------

    def subscribe(self) -> None:
        # The client may call these on its own thread (kafka-python 3 does, possibly while
        # the processor's thread is busy): log only.
        self.consumer.subscribe(
            self.topics,
            on_assigned=lambda tps: log.info("partitions assigned: %s", _names(tps)),
            on_revoked=lambda tps: log.info("partitions revoked: %s", _names(tps)),
        )
        # Fetch the topics' metadata now, after subscribing and before the first poll joins
        # the group: joined without it, a consumer gets no partitions (and may not notice for
        # minutes); fetched after the join, it makes kafka-python rebalance a second time.
        missing = [t for t in self.topics if not self.consumer.partitions_for_topic(t)]
        if missing:
            raise SettingsError(
                f"Kafka has no topic {', '.join(missing)}: create it (`shadow-ab services up`"
                " creates the default topics; `shadow-ab ingest` does unless"
                " SHADOW_AB_INGEST_CREATE_TOPICS=false) or fix the topic names"
            )

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current step (safe from a signal handler)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    def run(self, shutdown_timeout_s: float) -> bool:
        """Consume until :meth:`stop`; then flush and commit. False if the flush timed out."""
        self.subscribe()
        while not self._stopping:
            self.step()
        return self.shutdown(shutdown_timeout_s)

    def shutdown(self, timeout_s: float) -> bool:
        """Write and commit what is held and batched; True if everything was."""
        deadline = self.clock.monotonic() + timeout_s
        while self.held:
            self._submit_held()
            if self.held:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0 or not self.steps.join(remaining):
                    break
        self.steps.close()
        done = not self.held and self.steps.join(max(0.0, deadline - self.clock.monotonic()))
        if not done:
            log.error(
                "shutdown: could not write everything within %.0fs; the uncommitted messages"
                " will be read again by the next ingester (nothing is lost)",
                timeout_s,
            )
        return done

    def committed(self, offsets: dict[Partition, int]) -> None:
        """Called by the commit step after Kafka accepted ``offsets``."""
        self.committed_offsets.update(offsets)

    # -- one iteration ---------------------------------------------------------------------

    def step(self) -> None:
        self.steps.poll()
        if self.held:
            self._submit_held()
        if self.held:
            if not self.paused and self.wait_for_writer():
                return
            # Paused: poll only to keep the group membership alive, briefly, as the writer
            # may finish any moment. Pause again each time, so partitions newly assigned by a
            # rebalance are paused too.
            self.consumer.pause(*self.consumer.assignment())
            self.paused = True
            self._absorb(self.consumer.poll(timeout_ms=min(self.poll_timeout_ms, PAUSED_POLL_MS)))
            return
        if self.paused:
            self._resume()
        records = self.consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=self.max_records)
        self._absorb(records)
        self._submit_held()

    def wait_for_writer(self) -> bool:
        """Wait (up to ``poll_timeout_ms``) for a running write to finish and make room; False
        when no write is running, or no message has been taken for :data:`WAIT_FOR_WRITER_S`:
        then the caller pauses."""
        now = self.clock.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        left = self._waiting_since + WAIT_FOR_WRITER_S - now
        if left <= 0 or not isinstance(self.steps, Waits):
            return False
        return self.steps.wait(min(left, self.poll_timeout_ms / 1000))

    def _absorb(self, messages: list[Message]) -> None:
        if messages:
            self.taken += len(messages)
            self.held.extend(messages)

    def _submit_held(self) -> None:
        taken = 0
        try:
            for message in self.held:
                self.steps.submit(message)
                taken += 1
        except MessageRejected:
            pass  # the rest stays held: step() waits for a writer, or pauses
        finally:
            del self.held[:taken]
            if taken:
                self._waiting_since = None  # progress: the back-pressure starts anew

    def _resume(self) -> None:
        paused = self.consumer.paused()
        if paused:
            self.consumer.resume(*paused)
        self.paused = False


def _names(partitions: list[Partition]) -> list[tuple[str, int]]:
    return sorted((tp.topic, tp.partition) for tp in partitions)
