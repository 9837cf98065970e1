"""Click helpers shared by the parts' commands: the store URL option, times typed on the command
line, and pydantic's errors as lines a user can act on.

Imports no part (see the layering contracts in pyproject.toml), so every command can use it.
Translating the store's errors needs storage: that is :func:`storage.cli_support.storage_errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import click
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from shadow_ab.settings import CommonSettings
from shadow_ab.timestamps import as_utc

url_option = click.option(
    "--database-url",
    envvar=None,
    default=None,
    metavar="URL",
    help="sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
    " (default: SHADOW_AB_DATABASE_URL, else the embedded SQLite file)",
)


def parse_time(value: str | None, name: str) -> datetime | None:
    """ISO 8601 (``2026-11-30``, ``2026-11-30T12:00``, with ``Z`` or an offset); naive = UTC."""
    if value is None:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        ts = datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r} is not a time: use ISO 8601, e.g. 2026-11-30 or 2026-11-30T12:00:00Z",
            param_hint=name,
        ) from exc
    return as_utc(ts)


def resolve_url(database_url: str | None) -> str:
    """``--database-url``, else ``SHADOW_AB_DATABASE_URL``, else the embedded SQLite file;
    a usage error on ``--database-url`` when the URL cannot be used."""
    try:
        if database_url:
            return CommonSettings(database_url=database_url).database_url
        return CommonSettings().database_url
    except ValidationError as exc:
        raise click.BadParameter(
            "; ".join(explain(exc, where=None)), param_hint="--database-url"
        ) from exc


def explain(
    exc: ValidationError,
    *,
    where: Callable[[str], str] | None = str,
    message: Callable[[str, ErrorDetails], str | None] | None = None,
) -> list[str]:
    """One line per problem: ``<where it is set>: <what is wrong>``.

    ``where`` maps a field's dotted name to how the user sets it (a flag, an environment
    variable); by default the dotted name itself, ``None`` leaves it out. ``message(name, error)``
    may say better than pydantic what is wrong (None keeps pydantic's message, without its
    "Value error, " prefix).
    """
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = (message(loc, err) if message else None) or str(err["msg"]).removeprefix(
            "Value error, "
        )
        lines.append(f"{where(loc)}: {msg}" if loc and where else msg)
    return lines
