"""The Kafka sink's producer: confluent-kafka (librdkafka, in C).

librdkafka does the network I/O, batching and CRCs in C threads, outside the GIL (kafka-python,
the client before, did them in a Python thread that took the GIL from the mirror's event loop:
about twice the CPU per record, bench/results/2026-12-03-kafka-clients.md). This module gives
the sink (:mod:`mirror.kafka_sink`) the :class:`~mirror.kafka_sink.Producer` it uses, so the
sink's guarantees (bounded queue, spool, replay, delivery confirmed before a record counts as
sent, flush on close) are kept by the sink's code:

- ``send`` hands the record to librdkafka (``produce`` never blocks). Delivery reports are
  served by :meth:`ConfluentProducer.poll`, which the sink's thread calls at each of its rounds:
  no other Python thread takes the GIL for them. Every message gets a delivery report within
  ``message.timeout.ms``: an acknowledgement (``acks=all``, idempotent) or an error.
- a broker away at start: building the producer fails (no broker accepts a connection, or no
  metadata within :data:`~mirror.kafka_sink.BOOTSTRAP_TIMEOUT_S`), and the sink spools.
- **too large**: a record above ``message.max.bytes`` is refused by ``produce`` with
  :class:`MessageSizeTooLargeError`, the class name the sink knows. A broker that refuses a
  batch for its size (a topic's ``max.message.bytes`` lowered) fails the whole batch in
  librdkafka: the batch's largest record, when it is larger than the rest of the batch
  together, is the one reported as too large (first, so the sink replaces the producer and
  sends the others again); the others fail as :class:`BatchRefusedError`. Batches are at most
  ``message.max.bytes`` bytes (``batch.size``), and the sink builds a new producer with the
  topics' limit once it knows it, so a batch of records that each fit is not refused.
- a fatal librdkafka error (the idempotent producer's state lost) makes ``send`` raise and sets
  :attr:`ConfluentProducer.fatal`: the sink then builds a new producer.
- ``close(timeout)`` flushes until the timeout, then purges what is left (the sink has spooled
  those records already).

Properties: :func:`producer_properties`. Security:
:func:`shadow_ab.kafka_security.librdkafka_security`, from the ``SHADOW_AB_KAFKA_*`` variables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mirror.kafka_sink import KafkaSinkConfig

log = logging.getLogger(__name__)


class MessageSizeTooLargeError(Exception):
    """One record too large for the producer or the topic (the sink drops it alone)."""


class BatchRefusedError(Exception):
    """The broker refused a batch for its size because of another record in it."""


class DeliveryError(Exception):
    """Kafka did not acknowledge the record (timed out, broker away, purged at close)."""


class _Future:
    """A send's outcome: its callbacks run in ``poll``."""

    __slots__ = ("_callbacks", "_errbacks", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._callbacks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[Exception], Any]] = []

    def add_callback(self, fn: Callable[[Any], Any]) -> _Future:
        self._callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[Exception], Any]) -> _Future:
        self._errbacks.append(fn)
        return self

    def succeed(self, metadata: Any) -> None:
        for fn in self._callbacks:
            fn(metadata)

    def fail(self, exc: Exception) -> None:
        for fn in self._errbacks:
            fn(exc)


class ConfluentProducer:
    """A ``confluent_kafka.Producer`` as the sink's :class:`~mirror.kafka_sink.Producer`."""

    def __init__(self, producer: Any, config: dict[str, Any], *, metadata_timeout_s: float) -> None:
        self.producer = producer
        self.config = config
        """The librdkafka properties it was built with (secrets left out)."""
        self.fatal: str | None = None
        self._metadata_timeout_s = metadata_timeout_s
        self._refused: list[tuple[_Future, Any]] = []  # size refusals of the current poll

    # -- the sink's Producer ------------------------------------------------------------------

    def send(self, topic: str, *, key: bytes | None, value: bytes) -> _Future:
        from confluent_kafka import KafkaError, KafkaException

        if self.fatal is not None:
            raise ConnectionError(f"the Kafka producer hit a fatal error: {self.fatal}")
        future = _Future(len(value) + (len(key) if key else 0))
        try:
            self.producer.produce(topic, value=value, key=key, on_delivery=self._report(future))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise MessageSizeTooLargeError(err.str()) from None
            raise
        return future

    def partitions_for(self, topic: str) -> set[int] | None:
        return self.partitions_for_within(topic, self._metadata_timeout_s)

    def partitions_for_within(self, topic: str, timeout_s: float) -> set[int] | None:
        """The topic's partitions, None when Kafka has no such topic; raises librdkafka's
        ``KafkaException`` when Kafka does not answer within ``timeout_s``."""
        metadata = self.producer.list_topics(topic, timeout=timeout_s)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return set(found.partitions)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve the delivery reports that came (their futures' callbacks run here, on the
        caller's thread), waiting at most ``timeout`` seconds for one."""
        served = int(self.producer.poll(timeout))
        if self._refused:
            self._sort_refused()
        return served

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued within ``timeout`` seconds, then drop the rest (their sends
        fail)."""
        left = self.producer.flush(5.0 if timeout is None else max(0.0, timeout))
        if left:
            log.info("Kafka producer closing with %d records unacknowledged: purged", left)
            self.producer.purge()
            self.producer.flush(0)
        if self._refused:
            self._sort_refused()

    # -- delivery reports ---------------------------------------------------------------------

    def _report(self, future: _Future) -> Callable[[Any, Any], None]:
        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                future.succeed((msg.topic(), msg.partition(), msg.offset()))
                return
            from confluent_kafka import KafkaError

            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                self._refused.append((future, msg))  # sorted out after this poll
            else:
                future.fail(DeliveryError(err.str()))

        return delivered

    def _sort_refused(self) -> None:
        """A batch the broker refused for its size: its largest record, if larger than the
        others together, is the one too large (reported first); the others were refused with
        it. Without such a record the batch itself was too large: every record fails as
        refused (sent again; a batch is at most ``message.max.bytes`` bytes, so set it to the
        topics' ``max.message.bytes``)."""
        refused, self._refused = self._refused, []
        batches: dict[tuple[str, int], list[_Future]] = {}
        for future, msg in refused:
            batches.setdefault((msg.topic(), msg.partition()), []).append(future)
        for (topic, partition), futures in batches.items():
            largest: _Future | None = max(futures, key=lambda f: f.size)
            assert largest is not None
            if largest.size > sum(f.size for f in futures) - largest.size:
                largest.fail(MessageSizeTooLargeError(f"the broker refused it ({topic})"))
            else:
                log.error(
                    "Kafka refused a batch of %d records for its size on %s/%d although no"
                    " record in it is much larger than the others: set kafka.client's"
                    " message.max.bytes to the topics' max.message.bytes",
                    len(futures),
                    topic,
                    partition,
                )
                largest = None
            for f in futures:
                if f is not largest:
                    f.fail(BatchRefusedError(f"the broker refused the batch on {topic}"))


def _on_error(holder: list[ConfluentProducer]) -> Callable[[Any], None]:
    def on_error(err: Any) -> None:
        if err.fatal():
            log.error("Kafka producer fatal error (a new producer is built): %s", err.str())
            if holder:
                holder[0].fatal = err.str()
        else:
            log.info("Kafka: %s", err.str())

    return on_error


def producer_properties(config: KafkaSinkConfig) -> dict[str, Any]:
    """The producer's librdkafka properties (secrets left out): ``kafka.client`` over
    :data:`~mirror.kafka_sink.PRODUCER_DEFAULTS`, with what the sink fixes."""
    from mirror.kafka_sink import MAX_IN_FLIGHT
    from shadow_ab.kafka_config import lookup

    props: dict[str, Any] = config.producer_config()
    max_bytes = config.max_request_size
    # A batch never larger than a record may be: a batch of records that each fit is taken.
    batch = lookup(props, "batch.size")
    if batch is not None and int(batch) > max_bytes:
        props = {k: v for k, v in props.items() if k != "batch.size"} | {"batch.size": max_bytes}
    # The sink keeps at most MAX_IN_FLIGHT direct sends and as many from the spool; in bytes,
    # 32 MiB at least. Past it produce() refuses (BufferError): the sink spools.
    if lookup(props, "queue.buffering.max.messages") is None:
        props["queue.buffering.max.messages"] = max(100_000, 2 * MAX_IN_FLIGHT + 1000)
    if lookup(props, "queue.buffering.max.kbytes") is None:
        props["queue.buffering.max.kbytes"] = max(32 * 1024, 2 * max_bytes // 1024)
    # mirror.kafka_sink.OWNED_PROPERTIES: the sink's own, never from kafka.client.
    fixed = {"bootstrap.servers": config.bootstrap, "acks": "all", "enable.idempotence": True}
    return {**fixed, **props}


def make_confluent_producer(config: KafkaSinkConfig) -> ConfluentProducer:
    """A confluent-kafka producer as the sink wants it: acks=all, idempotent, batches of at most
    ``message.max.bytes``; raises when no broker answers within ``BOOTSTRAP_TIMEOUT_S``."""
    from confluent_kafka import KafkaException, Producer

    from mirror.kafka_sink import BOOTSTRAP_TIMEOUT_S, any_reachable
    from shadow_ab.kafka_security import librdkafka_security

    if not any_reachable(config.bootstrap, BOOTSTRAP_TIMEOUT_S):
        raise ConnectionError(f"no Kafka broker accepts connections at {config.bootstrap}")
    props = producer_properties(config)
    holder: list[ConfluentProducer] = []
    try:
        producer = Producer(
            {
                **props,
                "error_cb": _on_error(holder),
                "logger": logging.getLogger("mirror.librdkafka"),
                **librdkafka_security(),
            }
        )
    except KafkaException as exc:
        raise ValueError(f"Kafka producer settings refused: {exc}") from exc
    timeout_s = BOOTSTRAP_TIMEOUT_S
    wrapped = ConfluentProducer(producer, props, metadata_timeout_s=timeout_s)
    holder.append(wrapped)
    # Metadata now, so the first sends do not wait for it; no answer in time: Kafka is away.
    deadline = time.monotonic() + timeout_s
    try:
        for topic in (config.topic_exchanges, config.topic_health):
            left = max(0.1, deadline - time.monotonic())
            if wrapped.partitions_for_within(topic, left) is None:
                log.warning("no metadata for Kafka topic %s yet (does it exist?)", topic)
    except KafkaException as exc:
        wrapped.close(0.0)
        raise ConnectionError(f"no answer from Kafka at {config.bootstrap}: {exc}") from exc
    return wrapped
