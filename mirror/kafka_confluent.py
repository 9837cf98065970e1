"""The Kafka sink's producer on confluent-kafka (librdkafka, in C): ``kafka_client: confluent``.

kafka-python does its network I/O, batching and CRCs in a Python thread that takes the GIL from
the mirror's event loop; librdkafka does all of it in C threads. This module gives the sink
(:mod:`mirror.kafka_sink`) the same :class:`~mirror.kafka_sink.Producer` it has from
kafka-python, so the sink's guarantees (bounded queue, spool, replay, delivery confirmed before
a record counts as sent, flush on close) are kept by the same code for both clients:

- ``send`` hands the record to librdkafka (``produce`` never blocks). Delivery reports are
  served by :meth:`ConfluentProducer.poll`, which the sink's thread calls at each of its rounds:
  no other Python thread takes the GIL for them (kafka-python's I/O thread does, for every
  request). Every message gets a delivery report within ``message.timeout.ms``
  (``delivery_timeout_ms``): an acknowledgement (``acks=all``, idempotent) or an error.
- a broker away at start: as with kafka-python, building the producer fails (no broker accepts a
  connection, or no metadata within ``bootstrap_timeout_ms``), and the sink spools.
- **too large**: a record above ``message.max.bytes`` (``max_request_size``) is refused by
  ``produce`` with :class:`MessageSizeTooLargeError`, the class name the sink knows. A broker
  that refuses a batch for its size (a topic's ``max.message.bytes`` lowered) fails the whole
  batch in librdkafka (kafka-python splits it): the batch's largest record, when it is larger
  than the rest of the batch together, is the one reported as too large (first, so the sink
  replaces the producer and sends the others again); the others fail as
  :class:`BatchRefusedError`. Batches are at most ``max_request_size`` bytes (``batch.size``),
  and the sink builds a new producer with the topics' limit once it knows it, so a batch of
  records that each fit is not refused.
- a fatal librdkafka error (the idempotent producer's state lost) makes ``send`` raise and sets
  :attr:`ConfluentProducer.fatal`: the sink then builds a new producer.
- ``close(timeout)`` flushes until the timeout, then purges what is left (the sink has spooled
  those records already).

Security: :func:`shadow_ab.kafka_security.librdkafka_security`, from the same
``SHADOW_AB_KAFKA_*`` variables as the kafka-python producer.
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
    """A send's outcome, as kafka-python's future: its callbacks run in ``poll``."""

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
        refused (sent again; a batch is at most ``max_request_size`` bytes, so set it to the
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
                    " record in it is much larger than the others: set kafka.max_request_size"
                    " to the topics' max.message.bytes",
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


def make_confluent_producer(config: KafkaSinkConfig) -> ConfluentProducer:
    """A confluent-kafka producer as the sink wants it: acks=all, idempotent, batches of at most
    ``max_request_size`` bytes; raises when no broker answers within ``bootstrap_timeout_ms``."""
    from confluent_kafka import KafkaException, Producer

    from mirror.kafka_sink import any_reachable
    from shadow_ab.kafka_security import librdkafka_security

    if not any_reachable(config.bootstrap, config.bootstrap_timeout_ms / 1000):
        raise ConnectionError(f"no Kafka broker accepts connections at {config.bootstrap}")
    props: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap,
        "client.id": config.client_id,
        "acks": "all",
        "enable.idempotence": True,
        # The key's partition as kafka-python and the Java clients pick it (librdkafka's own
        # default hashes differently): a switch of client keeps a pair on its partition.
        "partitioner": "murmur2_random",
        "linger.ms": config.linger_ms,
        "batch.size": min(config.batch_size, config.max_request_size),
        "message.max.bytes": config.max_request_size,
        "compression.type": config.compression_type or "none",
        "request.timeout.ms": config.request_timeout_ms,
        "message.timeout.ms": config.delivery_timeout_ms,
        "reconnect.backoff.max.ms": config.reconnect_backoff_max_ms,
        # The sink keeps at most max_in_flight direct sends and as many from the spool; in
        # bytes, the bound kafka-python's producer had (buffer_memory, 32 MiB). Past it
        # produce() refuses (BufferError): the sink spools, as when kafka-python's send waits
        # max_block_ms for room in vain.
        "queue.buffering.max.messages": max(100_000, 2 * config.max_in_flight + 1000),
        "queue.buffering.max.kbytes": max(32 * 1024, 2 * config.max_request_size // 1024),
    }
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
    timeout_s = config.bootstrap_timeout_ms / 1000
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
