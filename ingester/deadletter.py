"""Sending poison messages to the dead-letter topic, with why, where from and the original bytes.

Headers: ``reason`` (``code: sentence``), ``source_topic``, ``source_partition``,
``source_offset``; key and value are the original message's, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingester.batch import DeadLetter
from ingester.clients import Producer
from ingester.errors import DeadLetterUnavailable
from ingester.metrics import DLQ_MESSAGES


def dead_letter_headers(letter: DeadLetter) -> list[tuple[str, bytes]]:
    msg = letter.message
    return [
        ("reason", letter.poison.header.encode()),
        ("source_topic", msg.topic.encode()),
        ("source_partition", str(msg.partition).encode()),
        ("source_offset", str(msg.offset).encode()),
    ]


class DeadLetters:
    """Sends dead letters through the ingester's producer (:mod:`ingester.clients`: acks=all,
    idempotent) and waits for Kafka to acknowledge them, so their offsets may be committed."""

    def __init__(self, producer: Producer, topic: str, timeout_s: float = 30.0) -> None:
        self.producer = producer
        self.topic = topic
        self.timeout_s = timeout_s

    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Send the letters not yet acknowledged; raise DeadLetterUnavailable if any fails."""
        pending = [letter for letter in letters if not letter.acked]
        if not pending:
            return
        futures = []
        for letter in pending:
            futures.append(
                self.producer.send(
                    self.topic,
                    key=letter.message.key,
                    value=letter.message.value,
                    headers=dead_letter_headers(letter),
                )
            )
        self.producer.flush(timeout=self.timeout_s)
        failures = []
        for letter, future in zip(pending, futures, strict=True):
            try:
                future.get(timeout=0)
            except Exception as exc:  # any send failure: keep the letter for the retry
                failures.append(exc)
                continue
            letter.acked = True
            DLQ_MESSAGES.labels(reason=letter.poison.code).inc()
        if failures:
            raise DeadLetterUnavailable(
                f"{len(failures)} of {len(pending)} dead letters were not acknowledged by"
                f" Kafka on {self.topic!r}: {failures[0]!r}"
            )
