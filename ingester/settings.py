"""The ingester's settings: flags, then ``SHADOW_AB_*`` environment variables, then defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from shadow_ab.kafka_config import Value, client_config
from shadow_ab.settings import CommonSettings
from shadow_ab.topics import TOPIC_DLQ, TOPIC_EXCHANGES, TOPIC_HEALTH

CONSUMER_DEFAULTS: dict[str, Value] = {
    # A new group reads the topics from their start: what the mirror sent before the first
    # ingester ran is ingested too.
    "auto.offset.reset": "earliest",
    # How soon a dead ingester's partitions move to the others (heartbeats every 3 s, at most a
    # third of it, unless heartbeat.interval.ms is given).
    "session.timeout.ms": 45_000,
    # Larger fetches: records are 1-5 KB, librdkafka's 1 MiB a partition is ~300 of them
    # (bench/ingest.py --fetch-partition-kb compares sizes).
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    # Every record the mirror produced (it writes no transactions).
    "isolation.level": "read_uncommitted",
}
"""The ingester's consumer properties; ``ingest_kafka_consumer`` is laid over them."""
CONSUMER_OWNED = {
    "bootstrap.servers": "set --kafka / SHADOW_AB_KAFKA_BOOTSTRAP",
    "group.id": "set --group / SHADOW_AB_INGEST_GROUP",
    "enable.auto.commit": "offsets are committed only after the store committed the batch",
    "enable.auto.offset.store": "offsets are committed only after the store committed the batch",
    "partition.assignment.strategy": (
        "the eager assignors (range,roundrobin): on a rebalance the processor drops its unwritten"
        " batch and reads again from the committed offsets"
    ),
}
"""Consumer properties the ingester sets itself."""


class IngestSettings(CommonSettings):
    """Settings of ``shadow-ab ingest``; environment names are ``SHADOW_AB_<FIELD>``."""

    ingest_group: str = Field(
        default="shadow-ab-ingester", min_length=1, description="Kafka consumer group id"
    )
    ingest_batch_size: int = Field(
        default=1000, ge=1, le=100_000, description="write a batch when it has this many messages"
    )
    ingest_batch_timeout_ms: int = Field(
        default=1000,
        ge=1,
        le=600_000,
        description="...or when its first message is this old (milliseconds)",
    )
    ingest_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="consumer processes in the group (the partitions are spread across them)",
    )
    ingest_inflight_batches: int = Field(
        default=2,
        ge=1,
        le=16,
        description=(
            "batches a worker writes at once on writer threads while it fetches and decodes the"
            " next (1: write inline); offsets are still committed in order, after the store"
        ),
    )
    ingest_decoder: Literal["rows", "msgspec", "pydantic"] = Field(
        default="rows",
        description=(
            "rows: msgspec straight to the store's row values (no record objects); msgspec:"
            " validate by schema in C into the records; pydantic for anything either is unsure"
            " of, or alone"
        ),
    )
    ingest_metrics_port: int = Field(
        default=0, ge=0, le=65535, description="serve Prometheus /metrics here; 0 = off"
    )
    ingest_metrics_host: str = Field(default="127.0.0.1", description="address for /metrics")
    ingest_topic_exchanges: str = Field(default=TOPIC_EXCHANGES, min_length=1)
    ingest_topic_health: str = Field(default=TOPIC_HEALTH, min_length=1)
    ingest_topic_dlq: str = Field(default=TOPIC_DLQ, min_length=1)
    ingest_retry_initial_ms: int = Field(default=200, ge=1, description="first retry delay")
    ingest_retry_max_ms: int = Field(default=10_000, ge=1, description="longest retry delay")
    ingest_shutdown_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM, how long to keep trying to write the batch"
    )
    ingest_poll_timeout_ms: int = Field(default=500, ge=1, le=10_000)
    ingest_create_topics: bool = Field(
        default=True, description="create the topics at start if they are missing"
    )
    ingest_kafka_consumer: dict[str, Value] = Field(
        default_factory=dict,
        description=(
            "librdkafka consumer properties laid over the ingester's defaults"
            " (ingester.clients.CONSUMER_DEFAULTS), as JSON in the environment, e.g."
            " SHADOW_AB_INGEST_KAFKA_CONSUMER='{\"session.timeout.ms\": 10000}'"
        ),
    )

    @field_validator("ingest_kafka_consumer")
    @classmethod
    def _known_properties(cls, given: dict[str, Value]) -> dict[str, Value]:
        client_config(given, defaults={}, client="consumer", owned=CONSUMER_OWNED)
        return given

    def consumer_config(self) -> dict[str, Value]:
        """The consumer's librdkafka properties: :data:`CONSUMER_DEFAULTS`, then
        ``ingest_kafka_consumer`` over them (the group, offsets and security are set apart)."""
        return client_config(
            self.ingest_kafka_consumer,
            defaults=CONSUMER_DEFAULTS,
            client="consumer",
            owned=CONSUMER_OWNED,
        )

    @model_validator(mode="after")
    def _usable(self) -> IngestSettings:
        if not self.kafka_bootstrap:
            raise ValueError(
                "no Kafka configured: pass --kafka HOST:PORT or set SHADOW_AB_KAFKA_BOOTSTRAP"
                " (for the local one: `shadow-ab services up`, then"
                ' `eval "$(shadow-ab services env)"`)'
            )
        if self.ingest_retry_max_ms < self.ingest_retry_initial_ms:
            raise ValueError(
                f"retry max ({self.ingest_retry_max_ms} ms) is below retry initial"
                f" ({self.ingest_retry_initial_ms} ms): raise SHADOW_AB_INGEST_RETRY_MAX_MS"
            )
        topics = [self.ingest_topic_exchanges, self.ingest_topic_health, self.ingest_topic_dlq]
        if len(set(topics)) != 3:
            raise ValueError(
                f"the exchanges, health and DLQ topics must differ, got {topics}: a dead letter"
                " must not be read back as input"
            )
        return self
