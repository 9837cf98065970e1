"""The ingester's Kafka client settings (``SHADOW_AB_INGEST_KAFKA_CONSUMER``: librdkafka
properties over its defaults) and the security settings its clients are built with. The clients
against the real Kafka are in test_ingest_services.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ingester.confluent_client import consumer_properties
from ingester.settings import CONSUMER_DEFAULTS, IngestSettings
from shadow_ab.cli import main
from shadow_ab.kafka_security import kafka_security, librdkafka_security


def test_an_unknown_consumer_property_is_refused_with_the_closest_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHADOW_AB_KAFKA_BOOTSTRAP", "h:1")
    monkeypatch.setenv("SHADOW_AB_INGEST_KAFKA_CONSUMER", '{"session.timeout": 10000}')
    result = CliRunner().invoke(main, ["ingest"])
    assert result.exit_code == 2
    assert "SHADOW_AB_INGEST_KAFKA_CONSUMER: 'session.timeout' is not a librdkafka" in result.output
    assert "did you mean 'session.timeout.ms'" in result.output
    # A producer's property is no consumer's; what the ingester sets itself is refused too.
    monkeypatch.delenv("SHADOW_AB_INGEST_KAFKA_CONSUMER")
    refused = {
        "linger.ms": "not a librdkafka consumer property",
        "enable.auto.commit": "only after the store committed",
        "group.id": "--group",
        "ssl.key.password": "SHADOW_AB_KAFKA_",
    }
    for key, why in refused.items():
        with pytest.raises(ValueError, match=why):
            IngestSettings(kafka_bootstrap="h:1", ingest_kafka_consumer={key: "x"})


def test_a_consumer_property_overrides_the_default_and_reaches_the_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import confluent_kafka

    from ingester.clients import make_consumer

    built: list[dict[str, object]] = []

    class Built(Exception):
        pass

    def consumer(props: dict[str, object]) -> object:
        built.append(props)
        raise Built  # stop there: only what librdkafka is handed matters

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    monkeypatch.setenv(
        "SHADOW_AB_INGEST_KAFKA_CONSUMER",
        '{"session.timeout.ms": 10000, "fetch.message.max.bytes": 1048576}',
    )
    settings = IngestSettings(kafka_bootstrap="h:1", ingest_group="g1")
    with pytest.raises(Built):
        make_consumer(settings, client_id="c1")
    (props,) = built
    assert props["session.timeout.ms"] == 10000 != CONSUMER_DEFAULTS["session.timeout.ms"]
    assert props["heartbeat.interval.ms"] == 3000  # follows the session timeout
    # Given under librdkafka's other name for max.partition.fetch.bytes: it replaces the default.
    assert props["fetch.message.max.bytes"] == 1048576
    assert "max.partition.fetch.bytes" not in props
    assert props["auto.offset.reset"] == CONSUMER_DEFAULTS["auto.offset.reset"]
    assert (props["group.id"], props["client.id"], props["bootstrap.servers"]) == (
        "g1",
        "c1",
        "h:1",
    )
    assert props["enable.auto.commit"] is False and props["enable.auto.offset.store"] is False
    assert consumer_properties(settings, client_id="c1") == {
        k: v for k, v in props.items() if k not in ("error_cb", "logger")
    }


def test_librdkafka_gets_the_same_tls_and_sasl_settings(tmp_path: Path) -> None:
    assert librdkafka_security({}) == {}
    ca = tmp_path / "ca.crt"
    ca.write_text("---")
    env = {
        "SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "SHADOW_AB_KAFKA_SASL_MECHANISM": "scram-sha-256",
        "SHADOW_AB_KAFKA_SASL_USERNAME": "shadow-ab-ingester",
        "SHADOW_AB_KAFKA_SASL_PASSWORD": "s3cret",
        "SHADOW_AB_KAFKA_SSL_CAFILE": str(ca),
        "SHADOW_AB_KAFKA_SSL_CERTFILE": str(ca),
        "SHADOW_AB_KAFKA_SSL_KEYFILE": str(ca),
    }
    assert librdkafka_security(env) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "shadow-ab-ingester",
        "sasl.password": "s3cret",
        "ssl.ca.location": str(ca),
        "ssl.certificate.location": str(ca),
        "ssl.key.location": str(ca),
        "ssl.endpoint.identification.algorithm": "https",
    }
    # Without a CA file, the system's certificates, as kafka-python's default context uses.
    tls = {"SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "SSL"}
    assert librdkafka_security(tls)["ssl.ca.location"] == "probe"
    assert "sasl.mechanism" not in librdkafka_security(tls)
    # One validation for both libraries: the same error, naming the variable.
    for build in (kafka_security, librdkafka_security):
        with pytest.raises(ValueError, match="SASL_USERNAME and"):
            build({"SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})


def test_confluent_kafka_accepts_the_settings() -> None:
    """librdkafka knows every property the mapping gives (it refuses an unknown one at once;
    a typo would otherwise only show against a secured cluster)."""
    from confluent_kafka import Consumer, Producer

    config = librdkafka_security(
        {
            "SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SHADOW_AB_KAFKA_SASL_USERNAME": "u",
            "SHADOW_AB_KAFKA_SASL_PASSWORD": "p",
        }
    )
    # 127.0.0.1:9 (discard): nothing is reached, the clients are only built.
    Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", **config}).close()
    Producer({"bootstrap.servers": "127.0.0.1:9", **config}).flush(0)
