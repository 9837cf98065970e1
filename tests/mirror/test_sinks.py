"""open_sink: the Kafka sink when configured, else the direct sink (embedded SQLite by default)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from factories import exchange, health
from sqlalchemy import text

from mirror.kafka_sink import KafkaSink, KafkaSinkConfig
from mirror.sinks import RecordSink, open_sink
from shadow_ab.records import ExchangeRecord, HealthSample
from storage.db import make_engine
from storage.sink import DirectSink


def records(deployment: str) -> tuple[ExchangeRecord, HealthSample]:
    now = datetime.now(UTC)
    return (
        exchange(deployment=deployment, stream=False, sent_at=now, e2e_s=0.1),
        health(deployment=deployment, ts=now),
    )


def counts(url: str, deployment: str) -> tuple[int, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            x = conn.execute(
                text("SELECT count(*) FROM exchanges WHERE deployment = :d"), {"d": deployment}
            ).scalar_one()
            h = conn.execute(
                text("SELECT count(*) FROM health_samples WHERE deployment = :d"),
                {"d": deployment},
            ).scalar_one()
    finally:
        engine.dispose()
    return int(x), int(h)


def test_default_is_the_embedded_sqlite_store_migrated_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("SHADOW_AB_HOME", str(home))
    sink = open_sink(kafka=None, database_url=None)
    assert isinstance(sink, DirectSink)
    assert isinstance(sink, RecordSink)
    ex, sample = records("sinks-sqlite")
    assert sink.submit(ex)
    assert sink.submit(sample)
    assert sink.close(30)
    sink.engine.dispose()
    db = home / "shadow-ab.db"
    assert db.exists()
    assert counts(f"sqlite:///{db}", "sinks-sqlite") == (1, 1)
    # A second start on the same file: already migrated, records add up.
    again = open_sink(kafka=None, database_url=f"sqlite:///{db}")
    assert again.submit(records("sinks-sqlite")[0])
    assert again.close(30)
    assert isinstance(again, DirectSink)
    again.engine.dispose()
    assert counts(f"sqlite:///{db}", "sinks-sqlite") == (2, 1)


def test_database_url_gives_a_direct_sink_on_postgresql(pg_url: str) -> None:
    # PostgreSQL is migrated by `shadow-ab db upgrade` (here: the template), not by the mirror.
    sink = open_sink(kafka=None, database_url=pg_url.replace("+psycopg", ""))
    assert isinstance(sink, DirectSink)
    ex, sample = records("sinks-pg")
    assert sink.submit(ex) and sink.submit(sample)
    assert sink.close(30)
    sink.engine.dispose()
    assert counts(pg_url, "sinks-pg") == (1, 1)


def test_kafka_config_gives_the_kafka_sink(tmp_path: Path) -> None:
    # Nothing listens at this address: the sink starts anyway and spools.
    sink = open_sink(
        kafka=KafkaSinkConfig(bootstrap="127.0.0.1:9", spool_dir=tmp_path / "spool"),
        database_url=f"sqlite:///{tmp_path / 'never-used.db'}",
    )
    assert isinstance(sink, KafkaSink)
    assert isinstance(sink, RecordSink)
    assert sink.submit(records("sinks-kafka")[0])
    assert sink.close(5)
    assert not (tmp_path / "never-used.db").exists()


def test_unsupported_database_url_is_refused() -> None:
    with pytest.raises(ValueError, match="not supported"):
        open_sink(kafka=None, database_url="mysql://x@y/z")
