"""The API's SQL, on SQLAlchemy Core (the same statements run on PostgreSQL and SQLite).

Every function takes an open :class:`~sqlalchemy.Connection` and returns rows or plain values;
deciding what is "not found" and what a token may see is the routes' business.

Divergent pairs are paged by keyset on the incumbent's ``(sent_at, pair_id)``: a page asks for
rows strictly after the last key of the previous page, so pages neither skip nor repeat pairs
when rows arrive meanwhile, and page N costs the same as page 1. SQL keeps only pairs whose
outputs or finish reasons differ (null-safe); the divergence figures are computed in Python.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, func, or_, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from api.errors import BadParameter
from storage.models import Deployment, Exchange, Incident, Report

Key = tuple[datetime, uuid.UUID]
AnyRow = Row[*tuple[Any, ...]]
"""A result row of any shape."""

SIDE_COLUMNS = (
    "role",
    "engine",
    "sent_at",
    "status",
    "finish_reason",
    "completion_tokens",
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "output_text",
    "logprobs",
)


def as_utc(value: datetime | None) -> datetime | None:
    """A query-parameter time in UTC; a time without zone is taken as UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def encode_cursor(key: Key) -> str:
    raw = f"{key[0].astimezone(UTC).isoformat()}|{key[1]}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The key a cursor holds; :class:`BadParameter` (422) when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, _, pair = raw.partition("|")
        sent_at = datetime.fromisoformat(when)
        if sent_at.tzinfo is None:
            raise ValueError("naive time")
        return sent_at, uuid.UUID(pair)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadParameter(
            f"cursor {cursor[:80]!r} is not a cursor this API issued: pass `next_cursor` from"
            " the previous page unchanged, or omit it for the first page"
        ) from None


def deployments(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(Deployment.__table__).order_by(Deployment.name)).all()


def deployment(conn: Connection, name: str) -> AnyRow | None:
    return conn.execute(select(Deployment.__table__).where(Deployment.name == name)).one_or_none()


def count_of(conn: Connection, model: type[Report] | type[Incident], name: str) -> int:
    table = model.__table__
    stmt = select(func.count()).select_from(table).where(table.c.deployment == name)
    return int(conn.execute(stmt).scalar_one())


_REPORT_SUMMARY: tuple[Any, ...] = (
    Report.id,
    Report.deployment,
    Report.created_at,
    Report.window_from,
    Report.window_to,
    Report.verdict,
    (Report.html.is_not(None)).label("has_html"),
)


def report_summaries(conn: Connection, name: str, limit: int) -> Sequence[AnyRow]:
    stmt = (
        select(*_REPORT_SUMMARY)
        .where(Report.deployment == name)
        .order_by(Report.created_at.desc(), Report.id.desc())
        .limit(limit)
    )
    return conn.execute(stmt).all()


def report(conn: Connection, name: str, report_id: int | None) -> AnyRow | None:
    """One report with body and html; ``report_id`` None means the newest."""
    stmt = select(*_REPORT_SUMMARY, Report.body, Report.html).where(Report.deployment == name)
    if report_id is None:
        stmt = stmt.order_by(Report.created_at.desc(), Report.id.desc()).limit(1)
    else:
        stmt = stmt.where(Report.id == report_id)
    return conn.execute(stmt).one_or_none()


def _differs(a: Any, b: Any) -> ColumnElement[bool]:
    return a.is_distinct_from(b)


def divergent_pairs(
    conn: Connection,
    name: str,
    *,
    against: str,
    after: Key | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> Sequence[AnyRow]:
    """Up to ``limit`` pairs whose outputs or finish reasons differ, in ``(incumbent.sent_at,
    pair_id)`` order after ``after``: the incumbent's side in ``i_*`` columns, the other
    role's in ``o_*``."""
    inc = Exchange.__table__.alias("inc")
    oth = Exchange.__table__.alias("oth")
    inc_cols = [inc.c[c].label(f"i_{c}") for c in SIDE_COLUMNS]
    oth_cols = [oth.c[c].label(f"o_{c}") for c in SIDE_COLUMNS]
    conditions = [
        inc.c.deployment == name,
        inc.c.role == "incumbent",
        or_(
            _differs(inc.c.output_text, oth.c.output_text),
            _differs(inc.c.finish_reason, oth.c.finish_reason),
        ),
    ]
    if after is not None:
        # The plain bound lets the (deployment, role, sent_at) index start at the cursor; the
        # row comparison then breaks ties on pair_id.
        conditions.append(inc.c.sent_at >= after[0])
        conditions.append(tuple_(inc.c.sent_at, inc.c.pair_id) > tuple_(after[0], after[1]))
    if since is not None:
        conditions.append(inc.c.sent_at >= since)
    if until is not None:
        conditions.append(inc.c.sent_at < until)
    stmt = (
        select(inc.c.pair_id, inc.c.endpoint, inc.c.model, inc.c.request, *inc_cols, *oth_cols)
        .select_from(
            inc.join(
                oth,
                and_(
                    oth.c.pair_id == inc.c.pair_id,
                    oth.c.deployment == inc.c.deployment,
                    oth.c.role == against,
                ),
            )
        )
        .where(*conditions)
        .order_by(inc.c.sent_at, inc.c.pair_id)
        .limit(limit)
    )
    return conn.execute(stmt).all()


def pair_exchanges(conn: Connection, name: str, pair_id: uuid.UUID) -> Sequence[AnyRow]:
    """Every exchange of one pair (one per role, normally)."""
    stmt = (
        select(Exchange.__table__)
        .where(Exchange.deployment == name, Exchange.pair_id == pair_id)
        .order_by(Exchange.role, Exchange.sent_at)
    )
    return conn.execute(stmt).all()
