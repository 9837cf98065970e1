"""The API's SQL, on SQLAlchemy Core (the same statements run on PostgreSQL and SQLite).

Every function takes an open :class:`~sqlalchemy.Connection` and returns rows or plain values;
deciding what is "not found" and what a token may see is the routes' business.

Divergent pairs are paged by keyset on the incumbent's ``(sent_at, pair_id)``: a page asks for
rows strictly after the last key of the previous page, so pages neither skip nor repeat pairs
when rows arrive meanwhile, and page N costs the same as page 1. SQL keeps only pairs whose
outputs or finish reasons differ (null-safe), scanning bounded time windows
(:func:`divergent_pairs`); the divergence figures are computed in Python.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, Table, and_, func, or_, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from api.errors import BadParameter
from storage.models import DEPLOYMENTS, EXCHANGES, Exchange, Report, client_traffic

Key = tuple[datetime, uuid.UUID]
AnyRow = Row[*tuple[Any, ...]]
"""A result row of any shape."""

FIRST_WINDOW = timedelta(minutes=15)
MAX_WINDOW = timedelta(days=1)
MAX_SCAN = timedelta(days=3)
"""Most time one request of divergent pairs reads before answering with a resume cursor."""
_TICK = timedelta(microseconds=1)
CURSOR_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
CURSOR_LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""A cursor's time is within these (api.deps' bounds for time parameters)."""
_LAST_UUID = uuid.UUID(int=2**128 - 1)
PAIR_SKEW = timedelta(hours=1)
"""Most a pair's other role may have been sent after (or before) the incumbent's request to
be listed as divergent; the mirror dispatches them at the same moment."""

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
        sent_at = sent_at.astimezone(UTC)
        if not CURSOR_EARLIEST <= sent_at < CURSOR_LATEST:
            raise ValueError("out of range")
        return sent_at, uuid.UUID(pair)
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise BadParameter(
            f"cursor {cursor[:80]!r} is not a cursor this API issued: pass `next_cursor` from"
            " the previous page unchanged, or omit it for the first page"
        ) from None


def deployments(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(DEPLOYMENTS).order_by(DEPLOYMENTS.c.name)).all()


def deployment(conn: Connection, name: str) -> AnyRow | None:
    return conn.execute(select(DEPLOYMENTS).where(DEPLOYMENTS.c.name == name)).one_or_none()


def count_of(conn: Connection, table: Table, name: str) -> int:
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


@dataclass(frozen=True)
class PairScan:
    """One page's worth of divergent pairs, and where the scan stopped."""

    rows: Sequence[AnyRow]
    """Up to ``limit`` rows in key order: the incumbent's side in ``i_*``, the other's in
    ``o_*``."""
    more: bool
    """Whether divergent pairs after the last row exist (or may, after ``resume``)."""
    resume: Key | None
    """Where to continue when the scan stopped before filling the page (``rows`` may then be
    short, even empty); None when the page is full or the data ends."""


def _incumbent_bound(conn: Connection, name: str, *, last: bool) -> datetime | None:
    col = Exchange.sent_at
    agg = func.max(col) if last else func.min(col)
    stmt = select(agg).where(Exchange.deployment == name, Exchange.role == "incumbent")
    bound: datetime | None = conn.execute(stmt).scalar_one_or_none()
    return bound


def _window(
    conn: Connection,
    name: str,
    against: str,
    after: Key | None,
    lo: datetime,
    hi: datetime,
    limit: int,
) -> Sequence[AnyRow]:
    """Divergent pairs whose incumbent was sent in ``[lo, hi)`` (and after ``after``).

    Both sides carry constant time bounds, so PostgreSQL reads only the daily partitions of
    the window; the other role is looked for within :data:`PAIR_SKEW` of the window."""
    inc = EXCHANGES.alias("inc")
    oth = EXCHANGES.alias("oth")
    inc_cols = [inc.c[c].label(f"i_{c}") for c in SIDE_COLUMNS]
    oth_cols = [oth.c[c].label(f"o_{c}") for c in SIDE_COLUMNS]
    conditions = [
        inc.c.deployment == name,
        inc.c.role == "incumbent",
        inc.c.sent_at >= lo,
        inc.c.sent_at < hi,
        client_traffic(inc),  # the mirror's probes are judged by evaluator/quality.py
        oth.c.sent_at >= lo - PAIR_SKEW,
        oth.c.sent_at < hi + PAIR_SKEW,
        or_(
            _differs(inc.c.output_text, oth.c.output_text),
            _differs(inc.c.finish_reason, oth.c.finish_reason),
        ),
    ]
    if after is not None:
        conditions.append(tuple_(inc.c.sent_at, inc.c.pair_id) > tuple_(after[0], after[1]))
    join_on = and_(
        oth.c.pair_id == inc.c.pair_id,
        oth.c.deployment == inc.c.deployment,
        oth.c.role == against,
    )
    stmt = (
        select(inc.c.pair_id, inc.c.endpoint, inc.c.model, inc.c.request, *inc_cols, *oth_cols)
        .select_from(inc.join(oth, join_on))
        .where(*conditions)
        .order_by(inc.c.sent_at, inc.c.pair_id)
        .limit(limit)
    )
    return conn.execute(stmt).all()


def divergent_pairs(
    conn: Connection,
    name: str,
    *,
    against: str,
    after: Key | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> PairScan:
    """Up to ``limit`` pairs whose outputs or finish reasons differ, in ``(incumbent.sent_at,
    pair_id)`` order after ``after``, within ``[since, until)``.

    The scan walks time windows from the cursor on (:data:`FIRST_WINDOW`, doubling up to
    :data:`MAX_WINDOW`), each one SQL statement that PostgreSQL confines to the window's
    partitions, until the page is full, the data ends, or :data:`MAX_SCAN` of time was read;
    then :attr:`PairScan.resume` says where the next request continues. So every request
    costs at most a bounded slice of the table, however sparse divergent pairs are."""
    lo = after[0] if after is not None else since
    if since is not None and lo is not None:
        lo = max(lo, since)
    if lo is None:
        lo = _incumbent_bound(conn, name, last=False)
    last = _incumbent_bound(conn, name, last=True)
    if lo is None or last is None:
        return PairScan(rows=[], more=False, resume=None)
    end = last + timedelta(microseconds=1)
    if until is not None:
        end = min(end, until)
    rows: list[AnyRow] = []
    want = limit + 1  # one more than the page: whether another page exists
    width, start = FIRST_WINDOW, lo
    while start < end and len(rows) < want:
        if start - lo >= MAX_SCAN:
            return PairScan(rows=rows, more=True, resume=(start - _TICK, _LAST_UUID))
        stop = min(start + width, end)
        rows.extend(_window(conn, name, against, after, start, stop, want - len(rows)))
        start, width = stop, min(width * 2, MAX_WINDOW)
    return PairScan(rows=rows[:limit], more=len(rows) > limit, resume=None)


def pair_exchanges(conn: Connection, name: str, pair_id: uuid.UUID) -> Sequence[AnyRow]:
    """Every exchange of one pair (one per role, normally)."""
    stmt = (
        select(EXCHANGES)
        .where(Exchange.deployment == name, Exchange.pair_id == pair_id)
        .order_by(Exchange.role, Exchange.sent_at)
    )
    return conn.execute(stmt).all()
