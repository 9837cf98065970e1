"""Engines for the store: PostgreSQL (psycopg 3) at scale, SQLite as the embedded default.

:func:`make_engine` is the one way to open the store; the writers, migrations and retention take
the engine it returns, so tests and other parts hand in whichever database they want.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from shadow_ab.privacy import redact_url as _redact_url
from shadow_ab.settings import normalize_database_url
from storage.errors import BadConfiguration

CONNECT_TIMEOUT_S = 5
SQLITE_BUSY_TIMEOUT_MS = 10_000


def normalize_url(url: str) -> str:
    """:func:`shadow_ab.settings.normalize_database_url`, failing as :class:`BadConfiguration`."""
    try:
        return normalize_database_url(url)
    except ValueError as exc:
        raise BadConfiguration(str(exc)) from None


def redact_url(url: str) -> str:
    """The URL without its password, for logs and messages (:func:`shadow_ab.privacy.redact_url`,
    the one helper for it)."""
    return _redact_url(url)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``).

    PostgreSQL: pre-ping pooled connections (a restarted server does not fail the next batch),
    a connect timeout so an unreachable server fails fast with :class:`StoreUnavailable` from
    the writers. SQLite: WAL journal, a busy timeout, foreign keys on, one connection per thread.
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        _private_file(make_url(url).database)
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S, **kwargs.pop("connect_args", {})}
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, connect_args=connect_args, **kwargs)


def _private_file(path: str | None) -> None:
    """Create the SQLite file readable by its owner only (0600: it holds prompts and outputs);
    SQLite gives its -wal and -shm files the same mode. An existing file is left as it is."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError:
        return  # a missing folder: SQLite's own error says it better when it connects
    os.close(fd)


def _sqlite_on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
        if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "memory":
            cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"
