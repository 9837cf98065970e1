"""The Kafka consumer and producer the ingester is handed, in the ingester's own terms.

The steps and the processor see only :class:`Consumer` and :class:`Producer` (partitions are
:class:`~ingester.batch.Partition`, offsets plain ints, messages anything with the
:class:`~ingester.batch.Message` attributes). Both are confluent-kafka's
(:mod:`ingester.confluent_client`): librdkafka in C, the fetch, the decompression and the
protocol parsing on its own threads, outside the GIL (bench/results/2026-12-03-kafka-clients.md).
The consumer's librdkafka properties are :data:`ingester.settings.CONSUMER_DEFAULTS` with
``SHADOW_AB_INGEST_KAFKA_CONSUMER`` laid over them; TLS and SASL come from
:mod:`shadow_ab.kafka_security`. It commits only the offsets it is given, never on its own, and
joins the group with the eager assignors (``range``, ``roundrobin``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from ingester.batch import Message, Partition
from ingester.errors import SettingsError
from ingester.settings import IngestSettings

PartitionsCallback = Callable[[list[Partition]], None]


class Consumer(Protocol):
    """What the ingester uses of a Kafka consumer (one thread: the processor's)."""

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assigned: PartitionsCallback,
        on_revoked: PartitionsCallback,
    ) -> None:
        """Join the group for ``topics``; the callbacks are told of each rebalance (they may be
        called on a client thread: they must only log)."""
        ...

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partitions (fetching its metadata), None if Kafka has no such topic."""
        ...

    def poll(self, timeout_ms: int, max_records: int | None = None) -> list[Message]:
        """Up to ``max_records`` messages, waiting at most ``timeout_ms`` (keeps the group
        membership alive)."""
        ...

    def assignment(self) -> set[Partition]: ...
    def pause(self, *partitions: Partition) -> None: ...
    def paused(self) -> set[Partition]: ...
    def resume(self, *partitions: Partition) -> None: ...
    def commit(self, offsets: Mapping[Partition, int]) -> None:
        """Commit, synchronously, the next offset to read of each partition; raises if Kafka
        did not take it."""
        ...

    def highwater(self, partition: Partition) -> int | None:
        """The partition's last known high-water mark (no request to Kafka), None if unknown."""
        ...

    def close(self) -> None:
        """Leave the group without committing anything."""
        ...


class SendResult(Protocol):
    """A send's outcome."""

    def get(self, timeout: float | None = None) -> Any:
        """The send's metadata; raises if Kafka did not acknowledge it."""
        ...


class Producer(Protocol):
    """What the ingester uses of a Kafka producer (the dead-letter topic): acks=all,
    idempotent."""

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


def unreachable(bootstrap: str, exc: Exception) -> SettingsError:
    return SettingsError(
        f"cannot reach Kafka at {bootstrap} ({exc}); check --kafka / SHADOW_AB_KAFKA_BOOTSTRAP,"
        " or start the local one with `shadow-ab services up`"
    )


def make_consumer(settings: IngestSettings, *, client_id: str = "shadow-ab-ingester") -> Consumer:
    """The consumer: manual commits, eager assignors."""
    from ingester.confluent_client import confluent_consumer

    return confluent_consumer(settings, client_id=client_id)


def make_producer(
    settings: IngestSettings, *, client_id: str = "shadow-ab-ingester-dlq"
) -> Producer:
    """The dead-letter producer (the same library as the consumer: one connection set-up and
    one TLS stack per process)."""
    from ingester.confluent_client import confluent_producer

    return confluent_producer(settings, client_id=client_id)
