"""The confluent-kafka consumer and producer behind :mod:`ingester.clients`' protocols.

confluent-kafka wraps librdkafka (C): fetching, decompressing and parsing the fetch responses
run on librdkafka's own threads, outside the GIL, and ``consume`` hands over ready messages.
What the ingester relies on, and how it is kept here:

- **Offsets**: ``enable.auto.commit`` and ``enable.auto.offset.store`` are off: the only
  commits are the synchronous ones :class:`~ingester.steps.CommitOffsets` makes after the
  store's commit and the dead letters' acknowledgement.
- **Rebalances**: the eager ``range,roundrobin`` assignors: on a
  rebalance every partition is revoked and read again from its committed offset. librdkafka
  calls the rebalance callbacks inside ``consume``, on the processor's thread; they log, and
  librdkafka then (un)assigns. Messages librdkafka fetched for a revoked partition are dropped
  by it, never handed over.
- **Pause**: librdkafka has no ``paused()``; the partitions paused and not resumed since are
  remembered here (a pause that outlives a rebalance is resumed all the same).
- **Lag**: ``highwater`` is librdkafka's cached high-water mark, updated by every fetch (no
  request to Kafka).
- **Errors**: librdkafka retries on its own what can be retried (a broker away, a leader
  moving): those are logged. A fatal error (``error.fatal()``) raises
  :class:`~ingester.errors.IngestError`, which stops the ingester without committing.
- **Properties**: :data:`ingester.settings.CONSUMER_DEFAULTS`, ``SHADOW_AB_INGEST_KAFKA_CONSUMER``
  over them, and what the ingester sets itself (:data:`ingester.settings.CONSUMER_OWNED`).
- **Security**: :func:`shadow_ab.kafka_security.librdkafka_security`, from the
  ``SHADOW_AB_KAFKA_*`` variables.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ingester.batch import Message, Partition
from ingester.clients import PartitionsCallback, unreachable
from ingester.errors import IngestError, SettingsError
from ingester.settings import IngestSettings
from shadow_ab.kafka_config import lookup
from shadow_ab.kafka_security import librdkafka_security
from shadow_ab.topics import DLQ_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 15.0
"""How long to wait for Kafka's metadata at start (then: cannot reach Kafka)."""


class Record:
    """One consumed message with the attributes the steps read (:class:`ingester.batch.Message`)."""

    __slots__ = ("key", "offset", "partition", "topic", "value")

    def __init__(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value

    def __repr__(self) -> str:
        return f"Record({self.topic!r}, {self.partition}, {self.offset})"


def _security() -> dict[str, str]:
    try:
        return librdkafka_security()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _on_error(err: Any) -> None:
    """librdkafka's client-wide errors (brokers away, authentication): logged; fatal ones
    stop the ingester (raised from the next ``consume``)."""
    if err.fatal():
        raise IngestError(f"Kafka client error (fatal, the ingester stops): {err.str()}")
    log.warning("Kafka: %s", err.str())


def _partitions(tps: Iterable[Any]) -> list[Partition]:
    return [Partition(tp.topic, tp.partition) for tp in tps]


class ConfluentConsumer:
    """A confluent-kafka consumer in the ingester's terms (:class:`~ingester.clients.Consumer`)."""

    def __init__(self, consumer: Any, bootstrap: str) -> None:
        from confluent_kafka import TopicPartition

        self.consumer = consumer
        self.bootstrap = bootstrap
        self._tp = TopicPartition
        self._paused: set[Partition] = set()

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> None:
        # Called inside consume(), on this (the processor's) thread; librdkafka assigns or
        # unassigns after the callback returns.
        self.consumer.subscribe(
            list(topics),
            on_assign=lambda _c, tps: on_assigned(_partitions(tps)),
            on_revoke=lambda _c, tps: on_revoked(_partitions(tps)),
            on_lost=lambda _c, tps: on_revoked(_partitions(tps)),
        )

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        from confluent_kafka import KafkaException

        try:
            metadata = self.consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise unreachable(self.bootstrap, exc) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return set(found.partitions)

    def poll(self, timeout_ms: int, max_records: int | None = None) -> list[Message]:
        messages = self.consumer.consume(num_messages=max_records or 1, timeout=timeout_ms / 1000)
        out: list[Message] = []
        append = out.append
        for m in messages:
            err = m.error()
            if err is not None:
                self._message_error(err)
                continue
            append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value()))
        return out

    def _message_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        if err.fatal():
            raise IngestError(f"Kafka consumer error (fatal, the ingester stops): {err.str()}")
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("Kafka consumer: %s", err.str())

    def assignment(self) -> set[Partition]:
        return set(_partitions(self.consumer.assignment()))

    def pause(self, *partitions: Partition) -> None:
        if partitions:
            self.consumer.pause([self._tp(tp.topic, tp.partition) for tp in partitions])
            self._paused.update(partitions)

    def paused(self) -> set[Partition]:
        return set(self._paused)

    def resume(self, *partitions: Partition) -> None:
        if partitions:
            # A partition no longer assigned is skipped by librdkafka (no error).
            self.consumer.resume([self._tp(tp.topic, tp.partition) for tp in partitions])
            self._paused.difference_update(partitions)

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        tps = [self._tp(tp.topic, tp.partition, off) for tp, off in offsets.items()]
        committed = self.consumer.commit(offsets=tps, asynchronous=False)
        failed = [tp for tp in committed or () if tp.error is not None]
        if failed:
            raise IngestError(
                "Kafka refused the offset commit of "
                + ", ".join(f"{tp.topic}/{tp.partition}: {tp.error}" for tp in failed)
            )

    def highwater(self, partition: Partition) -> int | None:
        _, high = self.consumer.get_watermark_offsets(
            self._tp(partition.topic, partition.partition), cached=True
        )
        return int(high) if high is not None and high >= 0 else None

    def close(self) -> None:
        # Auto-commit is off: closing leaves the group and commits nothing.
        self.consumer.close()


class _Delivery:
    """One produced message's outcome, filled in by librdkafka's delivery callback (run by
    ``flush``/``poll`` on the caller's thread)."""

    __slots__ = ("done", "error", "metadata")

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None
        self.metadata: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        self.done = True
        if err is not None:
            self.error = IngestError(f"Kafka did not acknowledge the message: {err.str()}")
        else:
            self.metadata = (msg.topic(), msg.partition(), msg.offset())

    def get(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        if not self.done:
            raise IngestError("Kafka has not acknowledged the message yet")
        return self.metadata


class ConfluentProducer:
    """A ``confluent_kafka.Producer`` in the ingester's terms (:class:`~ingester.clients.Producer`).

    ``send`` never raises: a message librdkafka would not queue is a failed send (its ``get``
    raises), so the dead letters are retried with the batch like any unacknowledged send."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> _Delivery:
        delivery = _Delivery()
        try:
            self.producer.produce(
                topic, value=value, key=key, headers=list(headers or []), on_delivery=delivery
            )
        except Exception as exc:  # BufferError (queue full), KafkaException: a failed send
            delivery.done = True
            delivery.error = exc
        return delivery

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(-1 if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        # confluent-kafka's producer has no close: deliver what is queued, then let it go.
        self.flush(timeout)


def consumer_properties(settings: IngestSettings, *, client_id: str) -> dict[str, Any]:
    """The consumer's librdkafka properties (secrets left out)."""
    props: dict[str, Any] = {"client.id": client_id, **settings.consumer_config()}
    if lookup(props, "heartbeat.interval.ms") is None:
        props["heartbeat.interval.ms"] = min(3000, int(props["session.timeout.ms"]) // 3)
    return props | {
        "bootstrap.servers": settings.kafka_bootstrap or "",
        "group.id": settings.ingest_group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "partition.assignment.strategy": "range,roundrobin",
    }


def confluent_consumer(settings: IngestSettings, *, client_id: str) -> ConfluentConsumer:
    from confluent_kafka import Consumer, KafkaException

    bootstrap = settings.kafka_bootstrap or ""
    config: dict[str, Any] = consumer_properties(settings, client_id=client_id)
    config |= {
        "error_cb": _on_error,
        "logger": logging.getLogger("ingester.librdkafka"),
        **_security(),
    }
    try:
        consumer = Consumer(config)
    except KafkaException as exc:
        raise SettingsError(f"Kafka consumer settings refused: {exc}") from exc
    wrapped = ConfluentConsumer(consumer, bootstrap)
    _check_reachable(consumer, bootstrap)
    return wrapped


def _check_reachable(client: Any, bootstrap: str) -> None:
    """Fail at start when no broker answers."""
    from confluent_kafka import KafkaException

    try:
        client.list_topics(timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise unreachable(bootstrap, exc) from exc


def confluent_producer(settings: IngestSettings, *, client_id: str) -> ConfluentProducer:
    from confluent_kafka import KafkaException, Producer

    bootstrap = settings.kafka_bootstrap or ""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        # A dead letter is a whole message of the other topics plus headers.
        "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
        "error_cb": _on_error,
        "logger": logging.getLogger("ingester.librdkafka"),
        **_security(),
    }
    try:
        producer = Producer(config)
    except KafkaException as exc:
        raise SettingsError(f"Kafka producer settings refused: {exc}") from exc
    _check_reachable(producer, bootstrap)
    return ConfluentProducer(producer)
