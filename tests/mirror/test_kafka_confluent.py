"""The confluent-kafka producer of the Kafka sink (mirror/kafka_confluent.py), on a stand-in
librdkafka producer: which record a size refusal names, and a fatal error. The sink's
behaviour on a real broker with this producer is tests/mirror/test_kafka_sink.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from factories import numbered_exchange

from mirror.kafka_confluent import (
    BatchRefusedError,
    ConfluentProducer,
    DeliveryError,
    MessageSizeTooLargeError,
)
from mirror.kafka_sink import KafkaSink, KafkaSinkConfig


class Msg:
    def __init__(self, topic: str, partition: int, value: bytes) -> None:
        self._topic, self._partition, self._value = topic, partition, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return 0

    def value(self) -> bytes:
        return self._value


class Librdkafka:
    """A stand-in ``confluent_kafka.Producer``: ``produce`` queues; the test decides each
    message's delivery report, served by the next ``poll`` (the sink's thread calls it)."""

    def __init__(self, refuse_above: int | None = None) -> None:
        self.refuse_above = refuse_above
        self.queued: list[tuple[Msg, Any]] = []
        self.reports: list[tuple[Any, Msg, Any]] = []
        self.lock = threading.Lock()

    def produce(self, topic: str, *, value: bytes, key: bytes | None, on_delivery: Any) -> None:
        if self.refuse_above is not None and len(value) > self.refuse_above:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        with self.lock:
            self.queued.append((Msg(topic, 0, value), on_delivery))

    def deliver_all(self, err: Any) -> None:
        with self.lock:
            self.reports += [(err, m, cb) for m, cb in self.queued]
            self.queued.clear()

    def poll(self, timeout: float) -> int:
        with self.lock:
            reports, self.reports = self.reports, []
        for err, msg, cb in reports:
            cb(err, msg)
        if not reports:
            threading.Event().wait(min(timeout, 0.01))
        return len(reports)

    def flush(self, timeout: float) -> int:
        return 0


def outcomes(producer: ConfluentProducer, values: list[bytes]) -> list[tuple[int, str]]:
    """Send ``values``; the (index, outcome) of each, in the order the sink would learn them."""
    got: list[tuple[int, str]] = []
    done = threading.Event()

    def record(i: int, what: str) -> None:
        got.append((i, what))
        if len(got) == len(values):
            done.set()

    for i, v in enumerate(values):
        f = producer.send("t", key=b"k", value=v)
        f.add_callback(lambda _md, i=i: record(i, "ok"))
        f.add_errback(lambda exc, i=i: record(i, type(exc).__name__))
    producer.producer.deliver_all(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert producer.poll(0) == len(values)
    assert done.is_set(), got
    return got


@pytest.fixture
def producer() -> Any:
    p = ConfluentProducer(Librdkafka(), {}, metadata_timeout_s=1.0)
    yield p
    p.close(0)


def test_a_refused_batch_names_its_one_large_record_first(producer: ConfluentProducer) -> None:
    values = [b"x" * 1000] * 5 + [b"y" * 200_000] + [b"x" * 1000] * 5
    got = outcomes(producer, values)
    assert got[0] == (5, "MessageSizeTooLargeError")  # first: the sink replaces the producer
    assert sorted(got[1:]) == [(i, "BatchRefusedError") for i in range(11) if i != 5]


def test_a_refused_batch_of_records_alike_drops_none(producer: ConfluentProducer) -> None:
    """No record much larger than the others: the batch was too large, not a record; every
    record fails as refused (the sink sends it again), none is taken as too large."""
    got = outcomes(producer, [b"x" * 1000] * 10)
    assert sorted(got) == [(i, BatchRefusedError.__name__) for i in range(10)]


def test_a_record_above_message_max_bytes_is_refused_by_send() -> None:
    p = ConfluentProducer(Librdkafka(refuse_above=100), {}, metadata_timeout_s=1.0)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            p.send("t", key=None, value=b"x" * 101)
        assert p.send("t", key=None, value=b"x" * 100) is not None
    finally:
        p.close(0)


def test_other_delivery_errors_fail_the_send(producer: ConfluentProducer) -> None:
    failed: list[Exception] = []
    done = threading.Event()
    f = producer.send("t", key=None, value=b"v")
    f.add_errback(lambda exc: (failed.append(exc), done.set()))
    producer.producer.deliver_all(KafkaError(KafkaError._MSG_TIMED_OUT))
    producer.poll(0)
    assert done.is_set()
    assert isinstance(failed[0], DeliveryError)


def test_a_fatal_producer_is_replaced_by_the_sink(tmp_path: Path) -> None:
    built: list[ConfluentProducer] = []

    def factory(_cfg: KafkaSinkConfig) -> ConfluentProducer:
        p = ConfluentProducer(Librdkafka(), {}, metadata_timeout_s=1.0)
        if not built:
            p.fatal = "the idempotent producer's state is lost"
        built.append(p)
        return p

    sink = KafkaSink(
        KafkaSinkConfig(bootstrap="x:1", spool_dir=tmp_path / "spool"),
        producer_factory=factory,
        retry_backoff_s=0.05,
        poll_s=0.01,
    )
    try:
        assert sink.submit(numbered_exchange("dep", 1))
        deadline = threading.Event()
        for _ in range(3000):
            if len(built) >= 2 and built[1].producer.queued:
                break
            deadline.wait(0.01)
        assert len(built) >= 2, "the sink kept the producer that hit a fatal error"
        assert built[1].producer.queued, "the spooled record was not sent on the new producer"
        built[1].producer.deliver_all(None)
        for _ in range(3000):  # flush() would not wait: Kafka is away until the ack comes
            if sink.stats().sent:
                break
            deadline.wait(0.01)
        assert sink.stats().sent == 1 and sink.stats().spooled == 1
        assert sink.flush(10)
    finally:
        sink.close(1)
