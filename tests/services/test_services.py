"""`shadow-ab services`: the real local servers, their idempotent start and clear errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from shadow_ab.dev.services.base import PortTakenError, ServicesSettings
from shadow_ab.dev.services.kafka import LocalKafka
from shadow_ab.dev.services.postgres import LocalPostgres
from shadow_ab.topics import TOPIC_DLQ, TOPIC_EXCHANGES, TOPIC_HEALTH


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shadow_ab", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


# These two talk to the servers through the CLI, which no fixture shows: marked by hand.
@pytest.mark.services
def test_status_reports_both_running() -> None:
    proc = _cli("services", "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines()}
    assert lines == {"postgres": "running", "kafka": "running"}


@pytest.mark.services
def test_second_up_is_idempotent_and_prints_env() -> None:
    proc = _cli("services", "up")
    assert proc.returncode == 0, proc.stderr
    assert "already running" in proc.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines())
    assert set(exports) == {"SHADOW_AB_DATABASE_URL", "SHADOW_AB_KAFKA_BOOTSTRAP"}


def test_postgres_accepts_connections(pg_server_url: str) -> None:
    dsn = pg_server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        (version,) = conn.execute("SHOW server_version").fetchone() or ("",)
        (listen,) = conn.execute("SHOW listen_addresses").fetchone() or ("",)
    assert version.split(".")[0].isdigit()
    assert listen == "127.0.0.1"


def test_kafka_has_the_contract_topics(kafka_bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topics = set(admin.list_topics(timeout=10).topics)
    assert {TOPIC_EXCHANGES, TOPIC_HEALTH, TOPIC_DLQ} <= topics


def test_port_taken_by_a_stranger_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        settings = ServicesSettings(pg_port=port, kafka_port=port, root=tmp_path)
        with pytest.raises(PortTakenError, match=f"port {port} is taken"):
            LocalPostgres(settings).up()
        with pytest.raises(PortTakenError, match=f"port {port} is taken"):
            LocalKafka(settings).up()
    # Nothing was installed or initialised in the stranger's stead.
    assert not (tmp_path / "postgres" / "data").exists()
    assert not (tmp_path / "kafka" / "data").exists()
