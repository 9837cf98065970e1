"""The loop that feeds Kafka messages into the steps and keeps the consumer group alive.

It polls the consumer (which also keeps the group membership: heartbeats and
``max.poll.interval.ms`` are respected because ``poll`` is called at least every
``poll_timeout_ms`` even while paused), submits each message to the first step, and on
:class:`~ingester.steps.MessageRejected` keeps the rest of that poll's messages, pauses every
assigned partition, and resumes once the steps take them again.

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
from ingester.steps import MessageRejected, Step

log = logging.getLogger(__name__)

PAUSED_POLL_MS = 10
"""Poll timeout while paused: how often a finished write is noticed (sleeps, no busy loop)."""


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
            # Paused: poll only to keep the group membership alive, briefly, as the writer
            # may finish any moment. Pause again each time, so partitions newly assigned by a
            # rebalance are paused too.
            self.consumer.pause(*self.consumer.assignment())
            self._absorb(self.consumer.poll(timeout_ms=min(self.poll_timeout_ms, PAUSED_POLL_MS)))
            return
        if self.paused:
            self._resume()
        records = self.consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=self.max_records)
        self._absorb(records)
        self._submit_held()

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
            if not self.paused:
                self._pause()
        finally:
            del self.held[:taken]

    def _pause(self) -> None:
        assigned = self.consumer.assignment()
        if assigned:
            self.consumer.pause(*assigned)
        self.paused = True

    def _resume(self) -> None:
        paused = self.consumer.paused()
        if paused:
            self.consumer.resume(*paused)
        self.paused = False


def _names(partitions: list[Partition]) -> list[tuple[str, int]]:
    return sorted((tp.topic, tp.partition) for tp in partitions)
