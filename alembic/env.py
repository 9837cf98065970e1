"""Alembic environment for the shadow-ab store.

The database URL comes from, in order: ``config.attributes["database_url"]`` (set by
:func:`storage.migrate.upgrade` and ``shadow-ab db ... --database-url``), ``-x database_url=URL``
on the alembic command line, ``sqlalchemy.url`` in alembic.ini if set, else
:class:`shadow_ab.settings.CommonSettings` (``SHADOW_AB_DATABASE_URL``).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from shadow_ab.settings import CommonSettings
from storage.db import make_engine
from storage.migrate import include_name
from storage.models import Base

MIGRATION_LOCK = 0x5AB_0002
config = context.config
if config.config_file_name is not None:  # the alembic command line: log as alembic.ini says
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def database_url() -> str:
    url = config.attributes.get("database_url")
    if url:
        return str(url)
    x_url = context.get_x_argument(as_dictionary=True).get("database_url")
    if x_url:
        return x_url
    ini_url = config.get_main_option("sqlalchemy.url")
    if ini_url:
        return ini_url
    return CommonSettings().database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        compare_type=True,
        include_name=include_name,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Processes starting together (ingester, mirror) may all migrate: one at a time.
            # Taken before Alembic reads the current revision, released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run(connection)
        return
    engine = make_engine(database_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
