"""The Kafka consumer and producer the ingester is handed: what it uses of them (the
:class:`Consumer` and :class:`Producer` protocols, which tests fake), and building the real
kafka-python ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from ingester.errors import SettingsError
from ingester.settings import IngestSettings
from shadow_ab.kafka_security import kafka_security
from shadow_ab.topics import DLQ_MAX_MESSAGE_BYTES


class Consumer(Protocol):
    """What the ingester uses of kafka-python's ``KafkaConsumer`` (partitions are its
    ``TopicPartition``)."""

    def subscribe(self, topics: Sequence[str], *, listener: Any) -> None: ...
    def partitions_for_topic(self, topic: str) -> set[int] | None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]: ...
    def assignment(self) -> set[Any]: ...
    def pause(self, *partitions: Any) -> None: ...
    def paused(self) -> set[Any]: ...
    def resume(self, *partitions: Any) -> None: ...
    def commit(self, offsets: Mapping[Any, Any]) -> None: ...
    def highwater(self, partition: Any) -> int | None: ...
    def close(self, autocommit: bool = True) -> None: ...


class SendResult(Protocol):
    """A send's outcome, as kafka-python's ``FutureRecordMetadata``."""

    def get(self, timeout: float | None = None) -> Any: ...


class Producer(Protocol):
    """What the ingester uses of kafka-python's ``KafkaProducer`` (the dead-letter topic)."""

    def send(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> SendResult: ...
    def flush(self, timeout: float | None = None) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...


def _unreachable(bootstrap: str, exc: Exception) -> SettingsError:
    return SettingsError(
        f"cannot reach Kafka at {bootstrap} ({exc}); check --kafka / SHADOW_AB_KAFKA_BOOTSTRAP,"
        " or start the local one with `shadow-ab services up`"
    )


def _security() -> dict[str, Any]:
    """TLS and SASL settings from the environment (:mod:`shadow_ab.kafka_security`)."""
    try:
        return kafka_security()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def make_consumer(settings: IngestSettings, *, client_id: str = "shadow-ab-ingester") -> Consumer:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaError

    bootstrap = settings.kafka_bootstrap or ""
    try:
        return KafkaConsumer(
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
        raise _unreachable(bootstrap, exc) from exc


def make_producer(
    settings: IngestSettings, *, client_id: str = "shadow-ab-ingester-dlq"
) -> Producer:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    bootstrap = settings.kafka_bootstrap or ""
    try:
        return KafkaProducer(
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
        raise _unreachable(bootstrap, exc) from exc
