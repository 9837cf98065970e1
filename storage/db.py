"""Engines for the store: PostgreSQL (psycopg 3) at scale, SQLite as the embedded default.

:func:`make_engine` is the one way to open the store; the writers, migrations and retention take
the engine it returns, so tests and other parts hand in whichever database they want.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

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
    """The URL without its password, for logs and messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparseable URL has no password we could hide reliably
        return url.split("@")[-1]


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://...``).

    PostgreSQL: pre-ping pooled connections (a restarted server does not fail the next batch),
    a connect timeout so an unreachable server fails fast with :class:`StoreUnavailable` from
    the writers. SQLite: WAL journal, a busy timeout, foreign keys on, one connection per thread.
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S, **kwargs.pop("connect_args", {})}
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, connect_args=connect_args, **kwargs)


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
