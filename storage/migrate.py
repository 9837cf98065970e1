"""Schema migrations (Alembic) driven from Python: upgrade, downgrade, current revision.

The migration scripts live in the top-level ``alembic/`` folder of the repository; the Alembic
configuration is built here, so no ``alembic.ini`` is needed at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from storage.db import make_engine, normalize_url
from storage.errors import BadConfiguration, translate
from storage.partitions import parse_partition_name

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "alembic"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic autogenerate filter: daily partitions are made at run time, not by migrations."""
    return not (type_ == "table" and name is not None and parse_partition_name(name))


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at our scripts and at ``url`` (passed via attributes)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise BadConfiguration(
            f"Alembic scripts not found at {MIGRATIONS_DIR}: install shadow-ab from a source"
            " checkout (pip install -e .) so the alembic/ folder is next to storage/"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    config.attributes["database_url"] = normalize_url(url)
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the store at ``url`` up to ``revision`` (default: the newest)."""
    with translate():
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the store at ``url`` down to ``revision`` (``base`` removes every table)."""
    with translate():
        command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the store at ``url`` is at, or None when it was never migrated."""
    engine = make_engine(url)
    try:
        with translate(), engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision of the migration scripts."""
    head_rev = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head_rev is None:
        raise BadConfiguration(f"no migrations found in {MIGRATIONS_DIR / 'versions'}")
    return head_rev
