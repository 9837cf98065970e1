"""Errors of the store, and the one place where database errors are translated into them.

Exception tree::

    StorageError                 base of everything below; catch it to catch any store failure
    ├── StoreUnavailable         transient: connection refused or lost, server shutting down,
    │                            too many connections, deadlock, serialization failure, SQLite
    │                            "database is locked". Retry the SAME batch with backoff; the
    │                            writers are idempotent, so a retry never duplicates rows.
    └── StoreError               permanent: retrying the same call will fail the same way
        ├── SchemaMissing        a table is missing: run ``shadow-ab db upgrade``
        └── BadConfiguration     an unsupported database URL or a missing migrations folder

``StoreUnavailable`` and ``StoreError`` are siblings on purpose: ``except StoreError`` never
swallows a transient failure, whichever order the ``except`` clauses come in.

Every SQLAlchemy/DBAPI error that leaves this package passes through :func:`translate` (used as
a context manager by the writers, migrations and retention), which raises one of these
``from`` the original exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import exc as sa_exc


class StorageError(Exception):
    """Base class of every error raised by :mod:`storage`."""


class StoreUnavailable(StorageError):
    """The database cannot be reached or asked us to retry. Retry the same call with backoff."""


class StoreError(StorageError):
    """A permanent failure: the same call will fail again. Fix the cause before retrying."""


class SchemaMissing(StoreError):
    """The database is reachable but not migrated (a table or view does not exist)."""


class BadConfiguration(StoreError):
    """The store is configured in a way this build cannot use."""


# SQLSTATEs (PostgreSQL) that mean "try again later", not "this request is wrong".
_TRANSIENT_SQLSTATES = {
    "08000",  # connection_exception
    "08001",  # sqlclient_unable_to_establish_sqlconnection
    "08003",  # connection_does_not_exist
    "08004",  # sqlserver_rejected_establishment_of_sqlconnection
    "08006",  # connection_failure
    "08007",  # transaction_resolution_unknown
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53000",  # insufficient_resources
    "53100",  # disk_full (an operator frees space; the batch stays valid)
    "53200",  # out_of_memory
    "53300",  # too_many_connections
    "55P03",  # lock_not_available
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up / recovering)
    "58000",  # system_error
    "58030",  # io_error
}
_MISSING_SQLSTATES = {"42P01", "42703"}  # undefined_table, undefined_column

_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "disk i/o error")
_SQLITE_MISSING = ("no such table", "has no column named", "no such column")


def _sqlstate(orig: BaseException | None) -> str | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else None


def classify(exc: BaseException) -> StorageError:
    """The storage error for a SQLAlchemy/DBAPI exception (not raised; the caller raises it)."""
    if isinstance(exc, StorageError):
        return exc
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    message = str(orig).strip()
    text = message.splitlines()[0] if message else type(orig).__name__
    lowered = message.lower()
    state = _sqlstate(orig)
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return StoreUnavailable(f"lost the connection to the database: {text}")
    if state in _TRANSIENT_SQLSTATES:
        return StoreUnavailable(f"database temporarily unavailable ({state}): {text}")
    if state in _MISSING_SQLSTATES or any(m in lowered for m in _SQLITE_MISSING):
        return SchemaMissing(f"the store is not migrated ({text}): run `shadow-ab db upgrade`")
    if any(m in lowered for m in _SQLITE_TRANSIENT):
        return StoreUnavailable(f"SQLite database busy: {text}")
    if isinstance(exc, sa_exc.TimeoutError):
        return StoreUnavailable(f"no database connection free in the pool: {text}")
    if "unable to open database file" in lowered:
        return StoreError(
            f"cannot open the SQLite database ({text}): check that its folder exists and is"
            " writable"
        )
    operational = (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
    if state is None and isinstance(exc, operational):
        # psycopg raises OperationalError without a SQLSTATE when it cannot connect at all
        # (connection refused, DNS, timeout) or when the server vanished mid-query.
        return StoreUnavailable(f"cannot reach the database: {text}")
    return StoreError(f"database error: {text}")


@contextmanager
def translate() -> Iterator[None]:
    """Re-raise SQLAlchemy/DBAPI errors as :class:`StorageError` subclasses (``from`` them)."""
    try:
        yield
    except StorageError:
        raise
    except (sa_exc.SQLAlchemyError, psycopg.Error) as exc:
        raise classify(exc) from exc
    except ConnectionError as exc:
        raise StoreUnavailable(f"cannot reach the database: {exc}") from exc
