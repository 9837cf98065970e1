"""Dependencies the routes share: the store's engine, a connection, the deployment check, and
parsing of time and format parameters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Literal

from fastapi import Depends, Path, Request
from sqlalchemy import Connection, Engine

from api import queries
from api.errors import BadParameter, NotFound
from api.queries import AnyRow

MAX_PAGE = 500

DeploymentName = Annotated[
    str, Path(min_length=1, max_length=200, description="the deployment's name")
]
Format = Literal["json", "html"]


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


Store = Annotated[Engine, Depends(get_engine)]


def get_connection(engine: Store) -> Iterator[Connection]:
    with engine.connect() as conn:
        yield conn


Conn = Annotated[Connection, Depends(get_connection)]


def deployment_row(conn: Connection, name: str) -> AnyRow:
    """The deployment's row; 404 naming it when there is none."""
    row = None if "\x00" in name else queries.deployment(conn, name)
    if row is None:
        raise NotFound(
            f"deployment {name!r} not found: GET /v1/deployments lists the known deployments"
        )
    return row


def utc_param(value: datetime | None, name: str) -> datetime | None:
    """A time query parameter in UTC (no zone means UTC); 422 when it cannot be one."""
    try:
        return queries.as_utc(value)
    except OverflowError:
        raise BadParameter(f"{name}={value} is outside the range of UTC times") from None


def check_window(since: datetime | None, until: datetime | None) -> None:
    if since is not None and until is not None and since >= until:
        raise BadParameter(
            f"since ({since.isoformat()}) must be before until ({until.isoformat()})"
        )


def wants_html(format: Format | None, accept: str | None) -> bool:
    """``?format=`` wins; else the Accept header, HTML only when preferred over JSON."""
    if format is not None:
        return format == "html"
    if not accept:
        return False
    weights: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, val = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        weights[media.lower()] = max(q, weights.get(media.lower(), 0.0))
    html = weights.get("text/html", 0.0)
    json = max(weights.get("application/json", 0.0), weights.get("*/*", 0.0) * 0.99)
    return html > 0 and html >= json
