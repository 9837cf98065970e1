"""Dependencies the routes share: the store's engine, a connection, the deployment check, and
parsing of time and format parameters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Request
from pydantic import BeforeValidator
from sqlalchemy import Connection, Engine

from api import queries
from api.errors import BadParameter, NotFound
from api.queries import AnyRow
from shadow_ab.timestamps import as_utc

MAX_PAGE = 500
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Time parameters (and cursors) must fall in [EARLIEST, LATEST): no record is outside it, and
date arithmetic near year 1 or 9999 overflows."""


def check_time_range(value: datetime, name: str) -> datetime:
    """``value`` (aware) when within [EARLIEST, LATEST); else 422 saying the range."""
    if not EARLIEST <= value < LATEST:
        raise BadParameter(
            f"{name}={value.isoformat()} is outside the times this API answers for"
            f" ({EARLIEST.date()} to {LATEST.date()}): give a time in that range, or leave"
            f" {name} out"
        )
    return value


DeploymentName = Annotated[str, Path(description="the deployment's name")]
Format = Literal["json", "html"]


def _declared_query(dependant: Any) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared_query(sub)
    return names


def reject_unknown_query(request: Request) -> None:
    """422 for a query parameter the endpoint does not take: a typo (``?role=`` for
    ``?engine_role=``) must not silently widen the answer."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None or not request.query_params:
        return
    declared = _declared_query(dependant)
    unknown = sorted(set(request.query_params) - declared)
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        takes = ", ".join(sorted(declared)) or "none"
        raise BadParameter(f"unknown query parameter {shown}: this endpoint takes {takes}")


def _iso_time(value: Any) -> Any:
    # Pydantic would read a bare number as Unix seconds; the API documents ISO 8601 only.
    if isinstance(value, str) and not any(c in value for c in "-:T"):
        raise ValueError("expected an ISO 8601 time such as 2026-11-30T00:00:00Z")
    return value


Time = Annotated[datetime, BeforeValidator(_iso_time)]
"""A time query parameter: ISO 8601 only (no zone means UTC)."""


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
    if value is None:
        return None
    try:
        utc = as_utc(value)
    except OverflowError:
        raise BadParameter(f"{name}={value} is outside the range of UTC times") from None
    return check_time_range(utc, name)


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
