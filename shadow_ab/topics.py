"""The Kafka topics shadow-ab uses, and creating them when they are missing.

``shadow-ab services up`` calls :func:`ensure_topics` once the broker answers; tests call it
with their own topic names (see :class:`TopicSpec`) so they do not interfere with each other.

Errors::

    TopicError          a topic could not be created or checked (message says why)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from shadow_ab.kafka_security import kafka_security

TOPIC_EXCHANGES = "shadow.exchanges"
"""Exchange records (:class:`shadow_ab.records.ExchangeRecord`), keyed by ``pair_id``."""
TOPIC_HEALTH = "shadow.health"
"""Health samples (:class:`shadow_ab.records.HealthSample`), keyed by engine."""
TOPIC_DLQ = "shadow.dlq"
"""Poison messages the ingester could not decode, with the reason in a header."""

DAY_MS = 24 * 60 * 60 * 1000


class TopicError(RuntimeError):
    """A topic could not be created or checked."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic: name, partition count and topic-level configs (retention and so on)."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


def default_topics(
    exchanges: str = TOPIC_EXCHANGES, health: str = TOPIC_HEALTH, dlq: str = TOPIC_DLQ
) -> list[TopicSpec]:
    """The three topics with their partitioning and retention.

    - exchanges: keyed by pair_id, 6 partitions so a few ingesters can share the load; kept
      7 days so an ingester outage of days loses nothing.
    - health: keyed by engine id, small records, 3 partitions, 7 days.
    - dlq: poison messages for a human to look at; 1 partition, kept 30 days; it takes
      messages up to ``DLQ_MAX_MESSAGE_BYTES``, twice the others' limit, so the copy of any
      message the others took fits with its headers.
    """
    common = {"cleanup.policy": "delete", "compression.type": "producer"}
    dlq_size = {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}
    return [
        TopicSpec(exchanges, 6, {**common, "retention.ms": str(7 * DAY_MS)}),
        TopicSpec(health, 3, {**common, "retention.ms": str(7 * DAY_MS)}),
        TopicSpec(dlq, 1, {**common, "retention.ms": str(30 * DAY_MS), **dlq_size}),
    ]


DLQ_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""The dead-letter topic's max.message.bytes (the ingester's producer may send this much)."""


def ensure_topics(
    bootstrap: str,
    specs: list[TopicSpec] | None = None,
    *,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the topics that do not exist yet; return the names that were created.

    Idempotent: topics that already exist are left as they are (their partition count and
    configs are not changed). Waits until every topic has a leader for each partition, so a
    producer or consumer started right after does not race the broker's metadata.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    specs = default_topics() if specs is None else specs
    timeout_ms = int(timeout_s * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="shadow-ab-topics",
            request_timeout_ms=timeout_ms,
            **kafka_security(),
        )
    except KafkaError as exc:
        raise TopicError(
            f"cannot reach Kafka at {bootstrap} to create topics ({exc}); is it running?"
            " (`shadow-ab services status`)"
        ) from exc
    try:
        existing = set(admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        created: list[str] = []
        for spec in missing:
            try:
                admin.create_topics(
                    {
                        spec.name: {
                            "num_partitions": spec.partitions,
                            "replication_factor": -1,  # the broker's default.replication.factor
                            "configs": spec.configs,
                        }
                    },
                    timeout_ms=timeout_ms,
                )
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass  # another process created it between list and create: fine
        admin.wait_for_topics([s.name for s in specs], timeout_ms=timeout_ms)
        return created
    except KafkaError as exc:
        raise TopicError(f"creating topics on {bootstrap} failed: {exc}") from exc
    finally:
        admin.close()


def delete_topics(bootstrap: str, names: list[str], *, timeout_s: float = 30.0) -> None:
    """Delete topics (tests and benchmarks clean up after themselves); missing ones are fine."""
    from kafka import KafkaAdminClient
    from kafka.errors import UnknownTopicOrPartitionError

    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="shadow-ab-topics", **kafka_security()
    )
    try:
        existing = set(admin.list_topics())
        present = [n for n in names if n in existing]
        if present:
            with contextlib.suppress(UnknownTopicOrPartitionError):  # deleted meanwhile
                admin.delete_topics(present, timeout_ms=int(timeout_s * 1000))
    finally:
        admin.close()
