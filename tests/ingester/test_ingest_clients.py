"""The Kafka client choice (ingester.clients): the setting, and the security settings both
client libraries are built with. The clients against the real Kafka are in
test_ingest_services.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from ingester.settings import IngestSettings
from shadow_ab.cli import main
from shadow_ab.kafka_security import kafka_security, librdkafka_security


def test_the_client_is_chosen_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_AB_INGEST_KAFKA_CLIENT", "confluent")
    assert IngestSettings(kafka_bootstrap="h:1").ingest_kafka_client == "confluent"
    with pytest.raises(ValidationError, match="kafka-python"):
        IngestSettings(kafka_bootstrap="h:1", ingest_kafka_client="librdkafka")  # type: ignore[arg-type]
    result = CliRunner().invoke(main, ["ingest", "--help"])
    assert "--kafka-client [kafka-python|confluent]" in result.output


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
