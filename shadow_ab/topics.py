"""The Kafka topics shadow-ab uses, and creating them when they are missing.

``shadow-ab services up`` calls :func:`ensure_topics` once the broker answers; tests call it
with their own topic names (see :class:`TopicSpec`) so they do not interfere with each other.

Errors::

    TopicError          a topic could not be created or checked (message says why)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from shadow_ab.kafka_security import librdkafka_security

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


def _admin(bootstrap: str) -> Any:
    """A confluent-kafka admin client (librdkafka; its log lines go to Python's logging)."""
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "shadow-ab-topics",
        "logger": logging.getLogger("shadow_ab.topics.librdkafka"),
        **librdkafka_security(),
    }
    return AdminClient(config)


def _code(exc: Exception) -> int | None:
    err = exc.args[0] if exc.args else None
    code = getattr(err, "code", None)
    return code() if callable(code) else None


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
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    specs = default_topics() if specs is None else specs
    deadline = time.monotonic() + timeout_s
    admin = _admin(bootstrap)
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise TopicError(
            f"cannot reach Kafka at {bootstrap} to create topics ({exc}); is it running?"
            " (`shadow-ab services status`)"
        ) from exc
    missing = [s for s in specs if s.name not in existing]
    created: list[str] = []
    if missing:
        new = [
            # replication_factor -1: the broker's default.replication.factor
            NewTopic(s.name, num_partitions=s.partitions, replication_factor=-1, config=s.configs)
            for s in missing
        ]
        futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as exc:
                if _code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile: fine
                    raise TopicError(f"creating topic {name} on {bootstrap} failed: {exc}") from exc
    _wait_for_leaders(admin, bootstrap, [s.name for s in specs], deadline)
    return created


def _wait_for_leaders(admin: Any, bootstrap: str, names: list[str], deadline: float) -> None:
    from confluent_kafka import KafkaException

    waiting = list(names)
    while waiting:
        try:
            metadata = admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as exc:
            raise TopicError(f"no metadata from Kafka at {bootstrap}: {exc}") from exc
        waiting = [
            name
            for name in waiting
            if (topic := metadata.topics.get(name)) is None
            or topic.error is not None
            or not topic.partitions
            or any(p.leader < 0 for p in topic.partitions.values())
        ]
        if waiting and time.monotonic() >= deadline:
            raise TopicError(f"topics {', '.join(waiting)} have no leader yet on {bootstrap}")
        if waiting:
            time.sleep(0.1)


def delete_topics(bootstrap: str, names: list[str], *, timeout_s: float = 30.0) -> None:
    """Delete topics (tests and benchmarks clean up after themselves); missing ones are fine."""
    from confluent_kafka import KafkaError, KafkaException

    admin = _admin(bootstrap)
    present = [n for n in names if n in admin.list_topics(timeout=timeout_s).topics]
    if not present:
        return
    futures = admin.delete_topics(present, operation_timeout=timeout_s, request_timeout=timeout_s)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if _code(exc) != KafkaError.UNKNOWN_TOPIC_OR_PART:  # deleted meanwhile: fine
                raise
