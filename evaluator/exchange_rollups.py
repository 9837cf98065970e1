"""Exchange rollups: what a review still counted over the raw rows, precomputed per hour.

The latency rollups (:mod:`evaluator.rollups`) cover the latency section; the rest of a review
read ``exchanges`` whole: incident detection (the exchanges sent per role and day, the failed,
timed-out or stalled exchanges, the per-minute counts around failures), the data extent (count
and first/last of the candidate's exchanges) and the divergence day table (pairs per day), each a
pass over every row of the window, growing with the pairs. :func:`refresh_exchange_rollups`
fills, per deployment and UTC hour (tables in migration 0004):

- ``exchange_counts``: per minute and role, the exchanges sent, the failed ones (``status`` in
  :data:`~evaluator.incidents.model.FAILED_STATUSES`), the first and last ``sent_at``;
- ``exchange_notables``: the exchanges detection may need, with the columns it reads: every one
  not ``ok``, and the slow ones past fixed floors (TTFT or one inter-token gap of at least
  :data:`STALL_FLOOR_S`, E2E of at least :data:`E2E_FLOOR_S`; ``max_itl_s`` the longest gap), so
  detection re-applies its own thresholds to them exactly as it would to the raw rows while its
  thresholds are at or above the floors (``hang_stall_s`` 10 s, shadow timeout 120 s by default;
  below them, :func:`closed_runs` returns nothing and detection reads the raw rows);
- ``exchange_parity``: per hour, the candidate's exchanges by load bucket (count, sums of both
  in-flight counts) and by guard state: the load parity table (:mod:`evaluator.parity`);
- ``exchange_rollup_hours``: which hours are done, and the floors they were kept at.

Client traffic only: the mirror's probes (``synthetic`` set, :mod:`mirror.probes`) are left out
of every table, as incident detection's and the data extent's raw reads leave them out.

It runs with the latency rollups (:func:`evaluator.rollups.refresh_rollups` calls it; the same
closed/grace rule, the same day-sized chunks, but its own record of done hours, so a store
upgraded to 0004 computes these for hours whose latency rollups exist already).

Readers take only *closed* hours wholly inside their window from here (:func:`closed_runs`) and
read the raw rows of everything else (:func:`raw_ranges`: the window's partial edge hours, the
open hours, hours never refreshed), so a reader is exact without a refresh, and fast after one.

The same SQL runs on PostgreSQL and SQLite. Errors: SQLAlchemy's, as the store raises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    false,
    func,
    insert,
    or_,
    select,
    text,
)
from sqlalchemy.sql.elements import TextClause

from shadow_ab.records import RECORD_TIME_MAX, RECORD_TIME_MIN
from storage.models import (
    CLIENT_TRAFFIC_SQL,
    EXCHANGE_COUNTS,
    EXCHANGE_NOTABLES,
    EXCHANGE_PARITY,
    EXCHANGE_ROLLUP_HOURS,
    EXCHANGES,
    Timestamp,
    client_traffic,
)

STALL_FLOOR_S = 5.0
"""Exchanges with a TTFT or an inter-token gap at least this long are kept as notable (half the
default ``IncidentConfig.hang_stall_s``)."""
E2E_FLOOR_S = 30.0
"""Exchanges lasting at least this long are kept as notable (an incumbent answer past the shadow
timeout is censored as a timeout; the mirror's default timeout is 120 s)."""
_LOCK_KEY = 0x5AB_0004
"""First half of the advisory lock key of a deployment's exchange refresh."""

Range = tuple[datetime, datetime]


def _floor_hour(ts: datetime) -> datetime:
    from evaluator.rollups import floor_hour

    return floor_hour(ts)


def _ceil_hour(ts: datetime) -> datetime:
    from evaluator.rollups import ceil_hour

    return ceil_hour(ts)


# --- refresh ---------------------------------------------------------------------------------


def _minute_expr(pg: bool) -> str:
    if pg:
        return "date_trunc('minute', sent_at)"
    return "strftime('%Y-%m-%d %H:%M:00.000000', sent_at)"


def _counts_sql(pg: bool) -> str:
    # imported here: evaluator.incidents' loader imports this module
    from evaluator.incidents.model import FAILED_STATUSES

    failed = ", ".join(f"'{s}'" for s in sorted(FAILED_STATUSES))
    minute = _minute_expr(pg)
    return f"""
INSERT INTO exchange_counts (deployment, minute, role, n, n_failed, first_sent, last_sent)
SELECT deployment, {minute}, role, count(*),
       sum(CASE WHEN status IN ({failed}) THEN 1 ELSE 0 END), min(sent_at), max(sent_at)
FROM exchanges
WHERE deployment = :deployment AND sent_at >= :lo AND sent_at < :hi AND {CLIENT_TRAFFIC_SQL}
GROUP BY deployment, {minute}, role
"""


def _notables_sql(pg: bool) -> str:
    if pg:
        gap = "(:stall <= ANY(itl_s))"
        longest = "(SELECT max(g) FROM unnest(itl_s) AS g)"
    else:
        gap = "EXISTS (SELECT 1 FROM json_each(exchanges.itl_s) WHERE value >= :stall)"
        longest = "(SELECT max(value) FROM json_each(exchanges.itl_s))"
    return f"""
INSERT INTO exchange_notables (deployment, sent_at, pair_id, role, engine, status, http_status,
                               error, ttft_s, e2e_s, max_itl_s)
SELECT deployment, sent_at, pair_id, role, engine, status, http_status, error, ttft_s, e2e_s,
       {longest}
FROM exchanges
WHERE deployment = :deployment AND sent_at >= :lo AND sent_at < :hi AND {CLIENT_TRAFFIC_SQL}
  AND (status <> 'ok' OR ttft_s >= :stall OR e2e_s >= :e2e
       OR (e2e_s >= :stall AND {gap}))
"""


def _parity_sql(pg: bool) -> str:
    from evaluator.rollups import LOAD_EDGES, _case, _hour_expr

    hour = _hour_expr(pg, "sent_at")
    bucket = _case("inflight_incumbent", LOAD_EDGES)
    state = "guard->>'state'" if pg else "json_extract(guard, '$.state')"
    where = (
        "deployment = :deployment AND sent_at >= :lo AND sent_at < :hi AND role = 'candidate'"
        f" AND {CLIENT_TRAFFIC_SQL}"
    )
    return f"""
INSERT INTO exchange_parity (deployment, hour, kind, key, n, sum_incumbent, sum_candidate)
SELECT deployment, {hour}, 'load', CAST({bucket} AS VARCHAR(64)), count(*),
       sum(inflight_incumbent), sum(inflight_candidate)
FROM exchanges
WHERE {where} AND inflight_incumbent IS NOT NULL AND inflight_candidate IS NOT NULL
GROUP BY deployment, {hour}, {bucket}
UNION ALL
SELECT deployment, {hour}, 'guard', coalesce({state}, 'none'), count(*), 0, 0
FROM exchanges
WHERE {where}
GROUP BY deployment, {hour}, coalesce({state}, 'none')
"""


def _stmt(sql: str) -> TextClause:
    return text(sql).bindparams(bindparam("lo", type_=Timestamp), bindparam("hi", type_=Timestamp))


def _compute_chunk(
    conn: Connection, deployment: str, lo: datetime, hi: datetime, closed_before: datetime
) -> None:
    from evaluator.rollups import hour_marks

    pg = conn.dialect.name == "postgresql"
    if pg:
        conn.execute(text("SET LOCAL jit = off"))
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:key, hashtext(:deployment))"),
            {"key": _LOCK_KEY, "deployment": deployment},
        )
    for table, column in (
        (EXCHANGE_COUNTS, "minute"),
        (EXCHANGE_PARITY, "hour"),
        (EXCHANGE_NOTABLES, "sent_at"),
        (EXCHANGE_ROLLUP_HOURS, "hour"),
    ):
        c = table.c
        conn.execute(
            delete(table).where(c.deployment == deployment, c[column] >= lo, c[column] < hi)
        )
    params = {"deployment": deployment, "lo": lo, "hi": hi}
    conn.execute(_stmt(_counts_sql(pg)), params)
    conn.execute(_stmt(_notables_sql(pg)), {**params, "stall": STALL_FLOOR_S, "e2e": E2E_FLOOR_S})
    conn.execute(_stmt(_parity_sql(pg)), params)
    hour_of = _hour_column(conn, EXCHANGE_COUNTS.c.minute)
    n_by_hour = {
        _floor_hour(h): int(n)
        for h, n in conn.execute(
            select(func.min(EXCHANGE_COUNTS.c.minute), func.sum(EXCHANGE_COUNTS.c.n))
            .where(in_ranges(EXCHANGE_COUNTS.c.minute, [(lo, hi)]))
            .where(EXCHANGE_COUNTS.c.deployment == deployment)
            .group_by(hour_of)
        )
    }
    notable_hour = _hour_column(conn, EXCHANGE_NOTABLES.c.sent_at)
    notable_by_hour = {
        _floor_hour(h): int(n)
        for h, n in conn.execute(
            select(func.min(EXCHANGE_NOTABLES.c.sent_at), func.count())
            .where(in_ranges(EXCHANGE_NOTABLES.c.sent_at, [(lo, hi)]))
            .where(EXCHANGE_NOTABLES.c.deployment == deployment)
            .group_by(notable_hour)
        )
    }
    rows = hour_marks(
        deployment,
        lo,
        hi,
        closed_before,
        {"n_exchanges": n_by_hour, "n_notable": notable_by_hour},
        stall_floor_s=STALL_FLOOR_S,
        e2e_floor_s=E2E_FLOOR_S,
    )
    conn.execute(insert(EXCHANGE_ROLLUP_HOURS), rows)


def _hour_column(conn: Connection, column: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return func.date_trunc("hour", column)
    return func.strftime("%Y-%m-%d %H", column)


def refresh_exchange_rollups(
    engine: Engine,
    deployment: str,
    first: datetime,
    last: datetime,
    *,
    closed_before: datetime,
    recompute: bool = False,
) -> int:
    """Roll up every hour in [``first``, ``last``) (whole hours) not rolled up and closed yet;
    the hours computed. Called by :func:`evaluator.rollups.refresh_rollups`."""
    from evaluator.rollups import CHUNK_HOURS, HOUR, _runs

    done: set[datetime] = set()
    if not recompute:
        with engine.connect() as conn:
            done = {
                _floor_hour(h)
                for h in conn.execute(
                    select(EXCHANGE_ROLLUP_HOURS.c.hour).where(
                        EXCHANGE_ROLLUP_HOURS.c.deployment == deployment,
                        EXCHANGE_ROLLUP_HOURS.c.hour >= first,
                        EXCHANGE_ROLLUP_HOURS.c.hour < last,
                        EXCHANGE_ROLLUP_HOURS.c.closed.is_(True),
                    )
                ).scalars()
            }
    todo = []
    h = first
    while h < last:
        if h not in done:
            todo.append(h)
        h += HOUR
    for a, b in _runs(todo, CHUNK_HOURS):
        with engine.begin() as conn:
            _compute_chunk(conn, deployment, a, b, closed_before)
    return len(todo)


# --- readers ---------------------------------------------------------------------------------


def closed_runs(
    conn: Connection,
    deployment: str,
    lo: datetime,
    hi: datetime,
    *,
    stall_s: float | None = None,
    timeout_s: float | None = None,
) -> list[Range]:
    """The closed, rolled-up hours wholly inside [``lo``, ``hi``), as contiguous [a, b) runs.
    With ``stall_s`` / ``timeout_s`` (a reader of the notables): none unless both are at or
    above the floors the hours were kept at."""
    from evaluator.rollups import HOUR

    if (stall_s is not None and stall_s < STALL_FLOOR_S) or (
        timeout_s is not None and timeout_s < E2E_FLOOR_S
    ):
        return []
    first, last = _ceil_hour(lo), _floor_hour(hi)
    if first >= last:
        return []
    h = EXCHANGE_ROLLUP_HOURS.c
    q = select(h.hour).where(
        h.deployment == deployment, h.hour >= first, h.hour < last, h.closed.is_(True)
    )
    if stall_s is not None:
        q = q.where(h.stall_floor_s <= stall_s)
    if timeout_s is not None:
        q = q.where(h.e2e_floor_s <= timeout_s)
    runs: list[Range] = []
    for hour in sorted(_floor_hour(x) for x in conn.execute(q).scalars()):
        if runs and runs[-1][1] == hour:
            runs[-1] = (runs[-1][0], hour + HOUR)
        else:
            runs.append((hour, hour + HOUR))
    return runs


def raw_ranges(lo: datetime, hi: datetime, runs: Sequence[Range]) -> list[Range]:
    """[``lo``, ``hi``) less the ``runs`` (sorted, disjoint, inside it): what to read raw."""
    out: list[Range] = []
    at = lo
    for a, b in runs:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


def in_ranges(column: Any, ranges: Sequence[Range]) -> ColumnElement[bool]:
    """SQL: ``column`` lies in one of the [a, b) ``ranges`` (false when there are none)."""
    if not ranges:
        return false()
    return or_(*(and_(column >= a, column < b) for a, b in ranges))


def split_window(
    conn: Connection,
    deployment: str,
    window: Range | None,
    *,
    stall_s: float | None = None,
    timeout_s: float | None = None,
) -> tuple[list[Range], list[Range]]:
    """(rolled-up runs, raw ranges) of ``window`` (None: all time)."""
    lo, hi = window or (RECORD_TIME_MIN, RECORD_TIME_MAX)
    runs = closed_runs(conn, deployment, lo, hi, stall_s=stall_s, timeout_s=timeout_s)
    return runs, raw_ranges(lo, hi, runs)


def role_extent(
    conn: Connection, deployment: str, roles: Sequence[str], window: Range | None = None
) -> tuple[int, datetime | None, datetime | None]:
    """(exchanges, first ``sent_at``, last ``sent_at``) of ``roles`` in ``window`` (None: all
    time): rolled-up minutes for the closed hours, the raw rows for the rest."""
    runs, raw = split_window(conn, deployment, window)
    c, x = EXCHANGE_COUNTS.c, EXCHANGES.c
    parts = []
    if runs:
        parts.append(
            conn.execute(
                select(func.sum(c.n), func.min(c.first_sent), func.max(c.last_sent)).where(
                    c.deployment == deployment, c.role.in_(roles), in_ranges(c.minute, runs)
                )
            ).one()
        )
    if raw:
        parts.append(
            conn.execute(
                select(func.count(), func.min(x.sent_at), func.max(x.sent_at)).where(
                    x.deployment == deployment,
                    x.role.in_(roles),
                    in_ranges(x.sent_at, raw),
                    client_traffic(),
                )
            ).one()
        )
    count = sum(int(n or 0) for n, _, _ in parts)
    firsts = [f for _, f, _ in parts if f is not None]
    lasts = [last for _, _, last in parts if last is not None]
    return count, min(firsts, default=None), max(lasts, default=None)
