"""The loop that feeds Kafka messages into the steps and keeps the consumer group alive.

It polls the consumer (which also keeps the group membership: heartbeats and
``max.poll.interval.ms`` are respected because ``poll`` is called at least every
``poll_timeout_ms`` even while paused), submits each message to the first step, and on
:class:`~ingester.steps.MessageRejected` keeps the rest of that poll's messages, pauses every
assigned partition, and resumes once the steps take them again.

On a rebalance the unwritten batch is dropped without committing its offsets, so the
partitions' next owner reads it again (see :meth:`StreamProcessor._on_revoked`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ingester.batch import Message, Partition
from ingester.clock import Clock
from ingester.errors import SettingsError
from ingester.steps import MessageRejected, Step

log = logging.getLogger(__name__)


class StreamProcessor:
    def __init__(
        self,
        consumer: Any,
        topics: list[str],
        make_steps: Callable[[], Step[Message]],
        clock: Clock,
        *,
        max_records: int,
        poll_timeout_ms: int = 100,
    ) -> None:
        self.consumer = consumer
        self.topics = topics
        self.make_steps = make_steps
        self.clock = clock
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.steps: Step[Message] = make_steps()
        self.held: list[Message] = []
        """Messages polled but not yet taken by the steps (at most one poll's worth)."""
        self.paused = False
        self._stopping = False
        self.uncommitted_from: dict[Partition, int] = {}
        """Per partition, the first offset taken from Kafka and not committed yet."""
        self.last_taken: dict[Partition, int] = {}
        self.committed_offsets: dict[Partition, int] = {}
        """Per partition, the last offset this processor committed."""

    # -- lifecycle -------------------------------------------------------------------------

    def subscribe(self) -> None:
        from kafka import ConsumerRebalanceListener

        # Know the topics' partitions before joining the group: a consumer that joins with
        # no metadata yet gets no partitions assigned, and may not notice for minutes.
        missing = [t for t in self.topics if not self.consumer.partitions_for_topic(t)]
        if missing:
            raise SettingsError(
                f"Kafka has no topic {', '.join(missing)}: create it (`shadow-ab services up`"
                " creates the default topics; `shadow-ab ingest` does unless"
                " SHADOW_AB_INGEST_CREATE_TOPICS=false) or fix the topic names"
            )
        processor = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                processor._on_revoked([Partition(tp.topic, tp.partition) for tp in revoked])

            def on_partitions_assigned(self, assigned: Any) -> None:
                processor._on_assigned(list(assigned))

        self.consumer.subscribe(self.topics, listener=Listener())

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

    # -- one iteration ---------------------------------------------------------------------

    def step(self) -> None:
        self.steps.poll()
        if self.held:
            self._submit_held()
        if self.held:
            # Paused: poll only to keep the group membership alive.
            self._absorb(self.consumer.poll(timeout_ms=self.poll_timeout_ms))
            return
        if self.paused:
            self._resume()
        records = self.consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=self.max_records)
        self._absorb(records)
        self._submit_held()

    def _absorb(self, records: dict[Any, list[Message]]) -> None:
        for messages in records.values():
            if messages:
                tp = Partition(messages[0].topic, messages[0].partition)
                self.uncommitted_from.setdefault(tp, messages[0].offset)
                self.last_taken[tp] = messages[-1].offset
            self.held.extend(messages)
        if self.held and self.paused:
            # Possible right after a rebalance assigned new, unpaused partitions.
            self._pause()

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

    def committed(self, offsets: dict[Partition, int]) -> None:
        """Called by the commit step after Kafka accepted ``offsets``."""
        self.committed_offsets.update(offsets)
        for tp, offset in offsets.items():
            if self.last_taken.get(tp, -1) >= offset:
                self.uncommitted_from[tp] = offset
            else:
                self.uncommitted_from.pop(tp, None)

    # -- rebalances ------------------------------------------------------------------------

    def _on_revoked(self, revoked: list[Partition]) -> None:
        # kafka-python 3 runs rebalance listeners on its IO thread, where the blocking consumer
        # API (commit) cannot be used, so the pending batch cannot be flushed here. Drop it,
        # and rewind each revoked partition to its first uncommitted offset: kafka-python keeps
        # a partition's position when the same partition comes back to us in the new
        # assignment, and otherwise its next owner starts from the committed offset. Either
        # way the dropped records are read again, and the writes are idempotent.
        if not revoked:
            return
        from kafka.structs import TopicPartition

        lost = set(revoked)
        dropped = sum(1 for m in self.held if Partition(m.topic, m.partition) in lost)
        self.held = [m for m in self.held if Partition(m.topic, m.partition) not in lost]
        for tp in revoked:
            start = self.uncommitted_from.pop(tp, None)
            self.last_taken.pop(tp, None)
            if start is not None:
                with contextlib.suppress(ValueError):  # already unassigned (consumer closing)
                    self.consumer.seek(TopicPartition(tp.topic, tp.partition), start)
        log.info(
            "partitions revoked: %s; dropped %d held messages and any unwritten batch; they"
            " are read again from the first uncommitted offset",
            sorted(revoked),
            dropped,
        )
        self.steps = self.make_steps()
        if not self.held:
            self.paused = False

    def _on_assigned(self, assigned: list[Any]) -> None:
        log.info("partitions assigned: %s", sorted((tp.topic, tp.partition) for tp in assigned))
        if self.paused and assigned:
            self.consumer.pause(*assigned)
