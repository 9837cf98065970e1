"""A PostgreSQL role for the API that can read the store and nothing else.

:func:`create_readonly_role` (also ``shadow-ab api --create-readonly-role NAME``) runs, as the
store's owner, the equivalent of::

    CREATE ROLE shadow_api NOLOGIN;          -- or LOGIN [PASSWORD '...']
    ALTER ROLE shadow_api SET default_transaction_read_only = on;
    GRANT CONNECT ON DATABASE <db> TO shadow_api;
    GRANT USAGE ON SCHEMA <schema> TO shadow_api;
    GRANT SELECT ON ALL TABLES IN SCHEMA <schema> TO shadow_api;   -- tables and the pairs view
    ALTER DEFAULT PRIVILEGES IN SCHEMA <schema> GRANT SELECT ON TABLES TO shadow_api;

Reading a partitioned table through its parent needs the privilege on the parent only, so new
daily partitions need no grant; the default privileges cover tables that later migrations add
(rollups) when the same owner creates them. Re-running it (after a migration) is harmless: the
role is created only if missing, the grants are idempotent. A NOLOGIN role is meant to be
granted to a login role (``GRANT shadow_api TO alice``); a LOGIN role is what
``SHADOW_AB_API_DATABASE_URL`` names.
"""

from __future__ import annotations

import re

from sqlalchemy import Engine, String, text

from storage.db import is_postgres
from storage.errors import BadConfiguration, translate

ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _literal(engine: Engine, value: str) -> str:
    process = String().literal_processor(engine.dialect)
    assert process is not None
    return str(process(value))


def readonly_role_sql(
    engine: Engine, name: str, *, login: bool = False, password: str | None = None
) -> list[str]:
    """The statements :func:`create_readonly_role` runs (schema and database of ``engine``)."""
    if not ROLE_NAME.match(name):
        raise BadConfiguration(
            f"role name {name!r} must be lowercase letters, digits and _ (at most 63),"
            " starting with a letter or _"
        )
    if password is not None and not login:
        raise BadConfiguration("a password only makes sense for a LOGIN role: add --login")
    q = engine.dialect.identifier_preparer.quote
    role = q(name)
    with translate(), engine.connect() as conn:
        database = str(conn.execute(text("SELECT current_database()")).scalar_one())
        schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
    login_sql = "LOGIN" if login else "NOLOGIN"
    if password is not None:
        login_sql += f" PASSWORD {_literal(engine, password)}"
    return [
        "DO $$ BEGIN\n"
        f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {_literal(engine, name)}) THEN\n"
        f"    CREATE ROLE {role} {login_sql};\n"
        "  END IF;\n"
        "END $$",
        f"ALTER ROLE {role} {login_sql}",
        f"ALTER ROLE {role} SET default_transaction_read_only = on",
        f"GRANT CONNECT ON DATABASE {q(database)} TO {role}",
        f"GRANT USAGE ON SCHEMA {q(schema)} TO {role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {q(schema)} TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {q(schema)} GRANT SELECT ON TABLES TO {role}",
    ]


def create_readonly_role(
    engine: Engine, name: str, *, login: bool = False, password: str | None = None
) -> list[str]:
    """Create (or refresh the grants of) a SELECT-only role; return the statements run, with
    any password masked. ``engine`` must connect as the store's owner."""
    if not is_postgres(engine):
        raise BadConfiguration(
            "database roles exist on PostgreSQL only; a SQLite store is read-only to the API"
            " through PRAGMA query_only"
        )
    statements = readonly_role_sql(engine, name, login=login, password=password)
    with translate(), engine.begin() as conn:
        raw = conn.execution_options(no_parameters=True)  # a ':' or '%' in a password is text
        for sql in statements:
            raw.exec_driver_sql(sql)
    if password is None:
        return statements
    hidden = _literal(engine, password)
    return [s.replace(hidden, "'***'") for s in statements]
