"""Settings shared by every process: where local state lives and how to reach the store and Kafka.

Each process (ingester, mirror, simulator, ...) has one settings class deriving from
:class:`CommonSettings`; values come from flags, then ``SHADOW_AB_*`` environment variables, then
defaults. ``shadow-ab services up`` prints the variables for the local services and keeps them in
``var/services.env`` (``eval "$(shadow-ab services env)"`` sets them in a shell). Pass settings
in; never import a global instance.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def state_dir() -> Path:
    """The project-local folder for services' data, spools and the embedded SQLite store."""
    return Path(os.environ.get("SHADOW_AB_HOME", "var")).resolve()


def services_env_file() -> Path:
    return state_dir() / "services.env"


def default_sqlite_url() -> str:
    return f"sqlite:///{state_dir() / 'shadow-ab.db'}"


def normalize_database_url(url: str) -> str:
    """Map ``postgresql://`` (and ``postgres://``) to the psycopg 3 driver we ship; raise
    ValueError for a dialect we do not support (naming only its scheme, never a password)."""
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if not url.startswith(("sqlite://", "postgresql+psycopg://")):
        scheme = url.split("://", 1)[0] if "://" in url else url[:20]
        raise ValueError(
            f"database URL scheme {scheme!r} is not supported: use sqlite:///PATH or"
            " postgresql+psycopg://USER@HOST:PORT/DB"
            " (`shadow-ab services up` starts a local PostgreSQL)"
        )
    return url


def check_bootstrap(v: str) -> str:
    """``v`` if it is ``HOST:PORT[,HOST:PORT]``; else ValueError saying what to give."""
    for part in v.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"Kafka bootstrap {part!r} must be HOST:PORT (e.g. 127.0.0.1:59092)")
    return v


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SHADOW_AB_",
        extra="ignore",
    )

    database_url: str = Field(
        default_factory=default_sqlite_url,
        description="SQLAlchemy URL of the store (sqlite:///path or postgresql+psycopg://...)",
    )
    kafka_bootstrap: str | None = Field(
        default=None, description="Kafka bootstrap servers, HOST:PORT[,HOST:PORT]"
    )

    @field_validator("database_url")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        return normalize_database_url(v)

    @field_validator("kafka_bootstrap")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        return check_bootstrap(v)
