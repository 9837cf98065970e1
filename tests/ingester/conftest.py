"""Fixtures of the ingester tests that use the real Kafka and PostgreSQL.

The servers are the ones `shadow-ab services up` started (``pg_server_url`` and
``kafka_bootstrap`` from the shared conftest fail loudly if they are not running). This session
gets its own database, a copy of the session's migrated template dropped at the end; each test
gets its own topics, consumer group and deployment name, so tests do not see each other's
records.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ingest_harness import Topics
from pg_throwaway import PgDatabases
from sqlalchemy import Engine

from shadow_ab.topics import TopicSpec, delete_topics, ensure_topics
from storage.db import make_engine


@pytest.fixture(scope="session")
def ingest_db_url(pg_databases: PgDatabases, pg_template: str) -> Iterator[str]:
    """A fresh database for this test session, migrated to head."""
    name, url = pg_databases.create(template=pg_template)
    yield url
    pg_databases.drop(name)


@pytest.fixture(scope="session")
def ingest_engine(ingest_db_url: str) -> Iterator[Engine]:
    engine = make_engine(ingest_db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[Topics]:
    """Topics, consumer group and deployment name of this test alone."""
    tag = uuid.uuid4().hex[:10]
    t = Topics(
        exchanges=f"ingest-test-{tag}.exchanges",
        health=f"ingest-test-{tag}.health",
        dlq=f"ingest-test-{tag}.dlq",
        group=f"ingest-test-{tag}",
        deployment=f"ingest-test-{tag}",
    )
    ensure_topics(
        kafka_bootstrap,
        [TopicSpec(t.exchanges, 3), TopicSpec(t.health, 2), TopicSpec(t.dlq, 1)],
    )
    yield t
    delete_topics(kafka_bootstrap, [t.exchanges, t.health, t.dlq])


@pytest.fixture
def private_pg_root() -> Iterator[Path]:
    """A folder for a throwaway PostgreSQL cluster, outside pytest's tmp_path: PostgreSQL runs
    as the `postgres` user, and any pytest run (other engineers run theirs on this machine)
    sets /tmp/pytest-of-<user> back to mode 0700, locking that user out mid-test."""
    root = Path(tempfile.mkdtemp(prefix="shadow-ab-ingest-pg-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)
