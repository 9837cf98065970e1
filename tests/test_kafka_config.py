"""Kafka client settings as librdkafka property maps (shadow_ab/kafka_config.py): the known
names are the installed librdkafka's, and the merge over a component's defaults."""

from __future__ import annotations

import pytest

from shadow_ab.kafka_config import CONSUMER, PRODUCER, client_config, lookup


def test_the_installed_librdkafka_knows_every_property_name() -> None:
    """A name librdkafka does not know is refused with "No such configuration property"; any
    other answer (a producer built, or a value refused) means it knows the name."""
    from confluent_kafka import KafkaException, Producer

    unknown = []
    for name in sorted(PRODUCER | CONSUMER):
        try:
            Producer({name: "0", "logger": _Quiet()}).flush(0)
        except (KafkaException, ValueError, TypeError) as exc:
            if "No such configuration property" in str(exc):
                unknown.append(name)
    assert unknown == []
    with pytest.raises(KafkaException, match="No such configuration property"):
        Producer({"linger_ms": "0"})  # the check above can fail


class _Quiet:
    """A logger for librdkafka's complaints about the odd values above."""

    def log(self, *_args: object) -> None:
        pass


def test_the_given_map_is_laid_over_the_defaults() -> None:
    merged = client_config(
        {"linger.ms": 5, "delivery.timeout.ms": 9000},
        defaults={"linger.ms": 100, "message.timeout.ms": 15000, "client.id": "x"},
        client="producer",
        owned={},
    )
    assert merged == {"linger.ms": 5, "delivery.timeout.ms": 9000, "client.id": "x"}
    assert lookup(merged, "message.timeout.ms") == 9000  # found under its alias
    assert lookup(merged, "batch.size") is None


def test_keys_are_checked_against_the_clients_properties() -> None:
    with pytest.raises(
        ValueError,
        match=r"'linger' is not a librdkafka producer property; did you"
        r" mean 'linger.ms'",
    ):
        client_config({"linger": 5}, defaults={}, client="producer", owned={})
    with pytest.raises(ValueError, match=r"'linger\.ms' is not a librdkafka consumer property"):
        client_config({"linger.ms": 5}, defaults={}, client="consumer", owned={})
    with pytest.raises(ValueError, match="cannot be set here: the sink's own"):
        # owned under one name, given under its alias
        client_config(
            {"request.required.acks": 1},
            defaults={},
            client="producer",
            owned={"acks": "the sink's own"},
        )
    with pytest.raises(ValueError, match="SHADOW_AB_KAFKA_"):
        client_config({"security.protocol": "SSL"}, defaults={}, client="consumer", owned={})
