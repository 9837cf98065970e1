"""Settings and the command line: bad configuration is refused with a sentence saying what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from ingester.cli import ingest
from ingester.settings import IngestSettings
from shadow_ab.cli import main
from storage.db import redact_url


@pytest.fixture
def bare_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No SHADOW_AB_* variables and no services env file."""
    import os

    for key in list(os.environ):
        if key.startswith("SHADOW_AB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def test_no_kafka_says_how_to_get_one(bare_env: None) -> None:
    result = CliRunner().invoke(main, ["ingest", "--database-url", "sqlite:///x.db"])
    assert result.exit_code == 2
    assert "pass --kafka HOST:PORT or set SHADOW_AB_KAFKA_BOOTSTRAP" in result.output
    assert "shadow-ab services up" in result.output


def test_bad_values_name_the_flag_and_the_variable(bare_env: None) -> None:
    result = CliRunner().invoke(
        ingest, ["--kafka", "localhost", "--batch-size", "0", "--database-url", "mysql://x"]
    )
    assert result.exit_code == 2
    assert "--batch-size / SHADOW_AB_INGEST_BATCH_SIZE" in result.output
    assert "--kafka / SHADOW_AB_KAFKA_BOOTSTRAP" in result.output
    assert "must be HOST:PORT" in result.output
    assert "--database-url / SHADOW_AB_DATABASE_URL" in result.output


def test_environment_is_read(bare_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHADOW_AB_KAFKA_BOOTSTRAP", "127.0.0.1:9")
    monkeypatch.setenv("SHADOW_AB_INGEST_BATCH_SIZE", "77")
    monkeypatch.setenv("SHADOW_AB_INGEST_TOPIC_DLQ", "my.dlq")
    s = IngestSettings()
    assert (s.kafka_bootstrap, s.ingest_batch_size, s.ingest_topic_dlq) == (
        "127.0.0.1:9",
        77,
        "my.dlq",
    )


def test_dlq_must_not_be_an_input_topic(bare_env: None) -> None:
    with pytest.raises(ValidationError, match="must differ"):
        IngestSettings(kafka_bootstrap="h:1", ingest_topic_dlq="shadow.exchanges")


def test_retry_bounds_are_checked(bare_env: None) -> None:
    with pytest.raises(ValidationError, match="SHADOW_AB_INGEST_RETRY_MAX_MS"):
        IngestSettings(kafka_bootstrap="h:1", ingest_retry_initial_ms=500, ingest_retry_max_ms=100)


def test_help_lists_the_flags() -> None:
    result = CliRunner().invoke(main, ["ingest", "--help"])
    assert result.exit_code == 0
    for flag in ("--kafka", "--database-url", "--group", "--batch-size", "--batch-timeout-ms"):
        assert flag in result.output
    assert "--metrics-port" in result.output


def test_passwords_are_not_logged() -> None:
    assert redact_url("postgresql+psycopg://u:secret@h:5/db") == "postgresql+psycopg://u:***@h:5/db"
    assert redact_url("sqlite:///x.db") == "sqlite:///x.db"
