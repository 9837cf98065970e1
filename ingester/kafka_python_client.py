"""The kafka-python consumer and producer behind :mod:`ingester.clients`' protocols.

Pure Python: the fetch responses are parsed, CRC-checked (crc32c in C) and turned into
``ConsumerRecord`` objects in the ingester's own process, under its GIL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ingester.batch import Message, Partition
from ingester.clients import PartitionsCallback, SendResult, unreachable
from ingester.errors import SettingsError
from ingester.settings import IngestSettings
from shadow_ab.kafka_security import kafka_security
from shadow_ab.topics import DLQ_MAX_MESSAGE_BYTES


def _security() -> dict[str, Any]:
    """TLS and SASL settings from the environment (:mod:`shadow_ab.kafka_security`)."""
    try:
        return kafka_security()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


class KafkaPythonConsumer:
    """A ``KafkaConsumer`` in the ingester's terms (:class:`ingester.clients.Consumer`)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> None:
        from kafka import ConsumerRebalanceListener

        class Listener(ConsumerRebalanceListener):
            # kafka-python 3 calls these on its IO thread, possibly while the processor's
            # thread is busy (a join can complete in the background after a poll timed out),
            # and the blocking consumer API cannot be used there: log only.
            def on_partitions_revoked(self, revoked: Any) -> None:
                on_revoked([Partition(tp.topic, tp.partition) for tp in revoked])

            def on_partitions_assigned(self, assigned: Any) -> None:
                on_assigned([Partition(tp.topic, tp.partition) for tp in assigned])

        self.consumer.subscribe(list(topics), listener=Listener())

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        found = self.consumer.partitions_for_topic(topic)
        return set(found) if found else None

    def poll(self, timeout_ms: int, max_records: int | None = None) -> list[Message]:
        records = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        if not records:
            return []
        out: list[Message] = []
        for messages in records.values():
            out.extend(messages)
        return out

    def assignment(self) -> set[Partition]:
        return {Partition(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def pause(self, *partitions: Partition) -> None:
        from kafka.structs import TopicPartition

        self.consumer.pause(*(TopicPartition(*tp) for tp in partitions))

    def paused(self) -> set[Partition]:
        return {Partition(tp.topic, tp.partition) for tp in self.consumer.paused()}

    def resume(self, *partitions: Partition) -> None:
        from kafka.structs import TopicPartition

        self.consumer.resume(*(TopicPartition(*tp) for tp in partitions))

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        from kafka.structs import OffsetAndMetadata, TopicPartition

        self.consumer.commit(
            {TopicPartition(*tp): OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()}
        )

    def highwater(self, partition: Partition) -> int | None:
        from kafka.structs import TopicPartition

        high = self.consumer.highwater(TopicPartition(*partition))
        return None if high is None else int(high)

    def close(self) -> None:
        self.consumer.close(autocommit=False)


class KafkaPythonProducer:
    """A ``KafkaProducer`` in the ingester's terms (:class:`ingester.clients.Producer`)."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> SendResult:
        result: SendResult = self.producer.send(
            topic, key=key, value=value, headers=list(headers or [])
        )
        return result

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)


def kafka_python_consumer(settings: IngestSettings, *, client_id: str) -> KafkaPythonConsumer:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaError

    bootstrap = settings.kafka_bootstrap or ""
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            group_id=settings.ingest_group,
            enable_auto_commit=False,
            auto_offset_reset=settings.ingest_auto_offset_reset,
            max_poll_records=settings.ingest_batch_size,
            session_timeout_ms=settings.ingest_session_timeout_ms,
            heartbeat_interval_ms=min(3000, settings.ingest_session_timeout_ms // 3),
            # Larger fetches: records are 1-4 KB, the default 1 MiB per partition is ~300 of them.
            max_partition_fetch_bytes=settings.ingest_fetch_partition_kb * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            # Eager rebalancing: every partition is revoked and positions restart from the
            # committed offsets, which the processor relies on when it drops an unwritten batch.
            partition_assignment_strategy=(RangePartitionAssignor, RoundRobinPartitionAssignor),
            **_security(),
        )
    except KafkaError as exc:
        raise unreachable(bootstrap, exc) from exc
    return KafkaPythonConsumer(consumer)


def kafka_python_producer(settings: IngestSettings, *, client_id: str) -> KafkaPythonProducer:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    bootstrap = settings.kafka_bootstrap or ""
    try:
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            # A dead letter is a whole message of the other topics plus headers.
            max_request_size=DLQ_MAX_MESSAGE_BYTES,
            **_security(),
        )
    except KafkaError as exc:
        raise unreachable(bootstrap, exc) from exc
    return KafkaPythonProducer(producer)
