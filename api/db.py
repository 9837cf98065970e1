"""The API's connection to the store: read-only at the session level.

On PostgreSQL every connection starts with ``default_transaction_read_only = on`` (so every
transaction it runs is READ ONLY and a write fails with SQLSTATE 25006) and a
``statement_timeout``; on SQLite every connection runs ``PRAGMA query_only = ON``. This guards
against bugs; the real barrier is connecting as a role that holds SELECT only
(:func:`api.roles.create_readonly_role`).
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import Engine, event

from storage.db import make_engine


def make_readonly_engine(url: str, *, statement_timeout_s: float = 30.0) -> Engine:
    """An engine on ``url`` whose sessions cannot write."""
    if url.startswith("sqlite"):
        engine = make_engine(url)
        event.listen(engine, "connect", _sqlite_query_only)
        return engine
    options = (
        "-c default_transaction_read_only=on"
        f" -c statement_timeout={max(1, int(statement_timeout_s * 1000))}"
        " -c application_name=shadow-ab-api"
    )
    return make_engine(url, connect_args={"options": options}, pool_size=5, max_overflow=5)


def _sqlite_query_only(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA query_only = ON")
    finally:
        cursor.close()
