"""Throw-away PostgreSQL databases on the test server, for the stores in tests/conftest.py."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from storage.db import normalize_url

SESSION_TAG = uuid.uuid4().hex[:8]


def _with_database(url: str, name: str) -> str:
    return make_url(normalize_url(url)).set(database=name).render_as_string(hide_password=False)


class PgDatabases:
    """Creates and drops throw-away databases on the test server."""

    def __init__(self, admin: Engine, server_url: str) -> None:
        self.admin = admin
        self.server_url = server_url
        self.count = 0

    def create(self, template: str | None = None) -> tuple[str, str]:
        self.count += 1
        name = f"shadow_test_{SESSION_TAG}_{self.count}"
        with self.admin.connect() as conn:
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
        return name, _with_database(self.server_url, name)

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
