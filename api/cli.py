"""``shadow-ab api``: serve the read-only query API, or create its read-only database role.

Settings: flags, then ``SHADOW_AB_API_*`` / ``SHADOW_AB_*`` environment variables
(:class:`api.settings.APISettings`). The server refuses to start without tokens unless
``--no-auth`` is given. ``--create-readonly-role NAME`` connects with the *owner's* URL
(``--database-url`` / ``SHADOW_AB_DATABASE_URL``), creates the role and exits; a LOGIN role's
password is read from ``SHADOW_AB_API_ROLE_PASSWORD`` (never from the command line).
"""

from __future__ import annotations

import os
from typing import Any

import click
from pydantic import ValidationError
from pydantic_settings import SettingsError

from api.settings import APISettings
from shadow_ab.cli_support import explain

PASSWORD_ENV = "SHADOW_AB_API_ROLE_PASSWORD"


def load_settings(**overrides: Any) -> APISettings:
    """Settings with the given flags on top; a usage error with the reasons when invalid."""
    given = {k: v for k, v in overrides.items() if v is not None and v is not False}
    try:
        return APISettings(**given)
    except ValidationError as exc:
        raise click.UsageError("; ".join(explain(exc, where=None))) from None
    except SettingsError as exc:  # an environment value pydantic-settings could not decode
        raise click.UsageError(str(exc)) from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", "api_host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", "api_port", type=int, default=None, help="Listen port (default 8600).")
@click.option(
    "--database-url",
    "api_database_url",
    default=None,
    metavar="URL",
    help="Store URL for serving, ideally a read-only role"
    " (default: SHADOW_AB_API_DATABASE_URL, else SHADOW_AB_DATABASE_URL).",
)
@click.option(
    "--tokens-file",
    "api_tokens_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="JSON/YAML map token -> scopes (also SHADOW_AB_API_TOKENS as JSON).",
)
@click.option(
    "--no-auth",
    "api_no_auth",
    is_flag=True,
    help="Serve WITHOUT authentication, every scope open (local development only).",
)
@click.option(
    "--create-readonly-role",
    "role",
    default=None,
    metavar="NAME",
    help="Create (or refresh the grants of) a SELECT-only PostgreSQL role, then exit."
    " Connects with SHADOW_AB_DATABASE_URL (the store's owner).",
)
@click.option(
    "--login",
    is_flag=True,
    help=f"With --create-readonly-role: a LOGIN role (password from ${PASSWORD_ENV}, if set).",
)
def api(role: str | None, login: bool, **flags: Any) -> None:
    """Serve the read-only query API (OpenAPI docs at /docs)."""
    if role is not None:
        _create_role(role, login, flags.get("api_database_url"))
        return
    settings = load_settings(**flags)
    _serve(settings)


def _create_role(name: str, login: bool, url: str | None) -> None:
    from api.roles import create_readonly_role
    from shadow_ab.cli_support import resolve_url
    from storage.db import make_engine
    from storage.errors import StorageError

    engine = make_engine(resolve_url(url))
    try:
        statements = create_readonly_role(
            engine, name, login=login, password=os.environ.get(PASSWORD_ENV) if login else None
        )
    except StorageError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()
    for sql in statements:
        click.echo(sql + ";")
    click.echo(f"role {name} can read the store and nothing else")


def _serve(settings: APISettings) -> None:
    import uvicorn

    from api.app import create_app
    from api.auth import TokenAuth
    from api.db import make_readonly_engine
    from storage.db import redact_url

    engine = make_readonly_engine(
        settings.store_url, statement_timeout_s=settings.api_statement_timeout_s
    )
    auth = TokenAuth(None if settings.api_no_auth else settings.token_map)
    if settings.api_no_auth:
        click.echo(
            "WARNING: --no-auth: anyone who reaches this port reads prompts and outputs", err=True
        )
    click.echo(
        f"shadow-ab api on http://{settings.api_host}:{settings.api_port}"
        f" (store {redact_url(settings.store_url)}, docs at /docs)",
        err=True,
    )
    from api import audit

    audit.configure()  # one JSON line per read of prompts or outputs, on stderr
    try:
        uvicorn.run(
            create_app(engine, auth),
            host=settings.api_host,
            port=settings.api_port,
            log_level="info",
        )
    finally:
        engine.dispose()
