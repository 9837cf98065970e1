"""Hourly latency rollups, so a month-long report never rescans the raw exchanges.

:func:`refresh_rollups` fills, per deployment and UTC hour (tables in migration 0003):

- ``latency_rollups``: per role (incumbent, candidate), metric (ttft, tpot, itl, e2e,
  tokens_per_s) and slice (``all``, ``load:<i>``, ``prompt:<i>``, ``output:<i>``, see
  :data:`SLICES`) a :class:`~evaluator.sketch.LogSketch` of the ``status = 'ok'`` values: the
  bucket index ``floor(ln(x) / ln(gamma))`` is computed in SQL and counted with GROUP BY, so the
  rows never travel to Python (ITL: every gap, ``unnest(itl_s)`` / ``json_each``; tokens/s:
  ``completion_tokens / (e2e_s - ttft_s)``);
- ``latency_samples``: up to ``sample_per_hour`` random pairs of the hour (incumbent and
  candidate side by side, ordered by ``random()`` in SQL), for the paired statistics;
- ``latency_rollup_hours``: which hours are done. Hours that ended more than ``grace`` before
  ``now`` are *closed* and never recomputed (unless ``recompute=True``); the still-open hour and
  the hours within the grace period (late rows from a lagging ingester) are recomputed by every
  refresh. Work goes in chunks of at most a day of hours, one transaction per chunk.

It also refreshes the exchange rollups (:mod:`evaluator.exchange_rollups`: per-minute counts and
notable exchanges, for incident detection, the data extent and the divergence day table).

Readers: :func:`load_sketches` (rolled-up hours plus, for the window's partial edge hours and
for warm-up exclusions, the same aggregation run over the raw rows of just that range),
:func:`load_sample` (each hour's first k sampled pairs, k proportional to the hour's pairs, up
to a total) and :func:`load_itl` (the ITL gaps of a few sampled pairs).

The same SQL runs on PostgreSQL and SQLite (>= 3.35 with its math functions; the dialect
differences are the hour truncation, the ITL unnest and the array aggregation).

Errors: SQLAlchemy's, as the store raises them.
"""

from __future__ import annotations

import math
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson
from sqlalchemy import Connection, Engine, bindparam, delete, insert, select, text
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from evaluator.results import Progress, Window
from evaluator.sketch import LN_GAMMA
from storage.models import (
    CLIENT_TRAFFIC_SQL,
    EXCHANGES,
    LATENCY_ROLLUP_HOURS,
    LATENCY_ROLLUPS,
    LATENCY_SAMPLES,
    LatencyRollupHour,
    Timestamp,
)

HOUR = timedelta(hours=1)
CHUNK_HOURS = 24
DEFAULT_GRACE = timedelta(minutes=10)
SAMPLE_PER_HOUR = 1000
WORK_MEM = "128MB"
"""PostgreSQL work_mem of a refresh transaction (SET LOCAL; the server default is 4 MB)."""
_LOCK_KEY = 0x5AB_0003
"""First half of the advisory lock key of a deployment's refresh (storage uses 0x5AB_0001)."""

LOAD_EDGES = (1, 2, 4, 8, 16, 32, 64)
"""inflight_incumbent at dispatch: buckets 0, 1, 2-3, 4-7, ..., 64+."""
PROMPT_EDGES = (128, 512, 2048, 8192)
OUTPUT_EDGES = (16, 64, 256, 1024)
SLICES: dict[str, tuple[str, tuple[int, ...]]] = {
    "load": ("inflight_incumbent", LOAD_EDGES),
    "prompt": ("prompt_tokens", PROMPT_EDGES),
    "output": ("completion_tokens", OUTPUT_EDGES),
}
"""Breakdown dimension -> (exchanges column, bucket edges). Not applied to ITL (its gaps are
many per exchange; the whole-window ITL sketch is enough)."""


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Human labels of the buckets ``CASE`` puts values in: "0-127", ..., "8192+"."""
    labels = []
    lo = 0
    for e in edges:
        labels.append(f"{lo}" if e - 1 == lo else f"{lo}-{e - 1}")
        lo = e
    labels.append(f"{lo}+")
    return labels


def floor_hour(ts: datetime) -> datetime:
    ts = ts.astimezone(UTC)
    return ts.replace(minute=0, second=0, microsecond=0)


def ceil_hour(ts: datetime) -> datetime:
    f = floor_hour(ts)
    return f if f == ts.astimezone(UTC) else f + HOUR


def _check_window(window: Window) -> tuple[datetime, datetime]:
    lo, hi = window
    if lo.tzinfo is None or hi.tzinfo is None:
        raise ValueError("window bounds must be timezone-aware (UTC)")
    if hi <= lo:
        raise ValueError(f"empty window: {lo} .. {hi}")
    return lo.astimezone(UTC), hi.astimezone(UTC)


# --- SQL -----------------------------------------------------------------------------------


def _is_pg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _sql(sql: str, *, hour: bool = False) -> TextClause | TextualSelect:
    """``sql`` with its ``:lo`` and ``:hi`` bound as the store's timestamps (and its ``hour``
    column read as one, when it returns it)."""
    stmt = text(sql).bindparams(bindparam("lo", type_=Timestamp), bindparam("hi", type_=Timestamp))
    return stmt.columns(hour=Timestamp) if hour else stmt


def _case(column: str, edges: Sequence[int]) -> str:
    whens = " ".join(f"WHEN {column} < {e} THEN {i}" for i, e in enumerate(edges))
    return f"CASE WHEN {column} IS NULL THEN NULL {whens} ELSE {len(edges)} END"


def _hour_expr(pg: bool, column: str) -> str:
    if pg:
        return f"date_trunc('hour', {column})"
    return f"strftime('%Y-%m-%d %H:00:00.000000', {column})"


_TPS = (
    "CASE WHEN {r}completion_tokens > 0 AND {r}e2e_s > {r}ttft_s"
    " THEN {r}completion_tokens / ({r}e2e_s - {r}ttft_s) END"
)
_SCALARS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "tokens_per_s": "tps"}


SAMPLE_ROLE_COLUMNS = tuple(
    f"{r}_{c}"
    for r in ("incumbent", "candidate")
    for c in (
        "status",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "tokens_per_s",
        "itl_mean_s",
        "completion_tokens",
    )
)
"""Both roles' columns of a ``latency_samples`` row, in table order."""


def _x_sql(pg: bool, roles: Sequence[str]) -> str:
    """The ok exchanges of :deployment in [:lo, :hi) with their hour and slice buckets."""
    role_list = ", ".join(f"'{r}'" for r in roles)
    slice_cols = ", ".join(
        f"{_case(col, edges)} AS b_{dim}" for dim, (col, edges) in SLICES.items()
    )
    return (
        f"SELECT {_hour_expr(pg, 'sent_at')} AS hour, role, ttft_s, tpot_s, e2e_s,"
        f" {_TPS.format(r='')} AS tps, itl_s, {slice_cols}"
        " FROM exchanges WHERE deployment = :deployment AND sent_at >= :lo AND sent_at < :hi"
        f" AND status = 'ok' AND role IN ({role_list})"
        f" AND {CLIENT_TRAFFIC_SQL}"
    )


_IDX = "CASE WHEN {v} > 0 THEN CAST(floor(ln({v}) / :ln_gamma) AS INTEGER) END"


def _grouped_pg(roles: Sequence[str]) -> str:
    """PostgreSQL: one pass over the rows for the scalar metrics (unpivoted with a LATERAL
    VALUES, every slice at once with GROUPING SETS), one pass over the unnested ITL gaps."""
    unpivot = ", ".join(f"('{m}', x.{col})" for m, col in _SCALARS.items())
    sets = ", ".join(
        ["(hour, role, metric, k)"] + [f"(hour, role, metric, k, b_{d})" for d in SLICES]
    )
    slice_case = " ".join(f"WHEN GROUPING(b_{d}) = 0 THEN '{d}:' || b_{d}" for d in SLICES)
    return f"""
WITH x AS NOT MATERIALIZED ({_x_sql(True, roles)})
SELECT hour, role, metric, CASE {slice_case} ELSE 'all' END AS slice,
       k, count(*) AS c, sum(val) AS sm, min(val) AS mn, max(val) AS mx
FROM (
    SELECT x.hour, x.role, m.metric, m.val, {", ".join(f"x.b_{d}" for d in SLICES)},
           {_IDX.format(v="m.val")} AS k
    FROM x CROSS JOIN LATERAL (VALUES {unpivot}) AS m(metric, val)
    WHERE m.val IS NOT NULL
) q
GROUP BY GROUPING SETS ({sets})
UNION ALL
SELECT hour, role, 'itl', 'all', k, count(*), sum(g), min(g), max(g)
FROM (
    SELECT x.hour, x.role, g, {_IDX.format(v="g")} AS k
    FROM x CROSS JOIN LATERAL unnest(x.itl_s) AS g
) u
GROUP BY hour, role, k
"""


def _grouped_sqlite(roles: Sequence[str]) -> str:
    """SQLite (no GROUPING SETS): values unpivoted with UNION ALL, one GROUP BY per slice."""
    dims = ", ".join(f"b_{d}" for d in SLICES)
    nulls = ", ".join(f"NULL AS b_{d}" for d in SLICES)
    parts = [
        f"SELECT hour, role, '{m}' AS metric, {col} AS val, {dims} FROM x WHERE {col} IS NOT NULL"
        for m, col in _SCALARS.items()
    ]
    parts.append(
        f"SELECT hour, role, 'itl' AS metric, je.value AS val, {nulls}"
        " FROM x, json_each(x.itl_s) AS je"
    )
    values = "\nUNION ALL ".join(parts)
    grouped = [
        "SELECT hour, role, metric, 'all' AS slice, k, count(*) AS c, sum(val) AS sm,"
        " min(val) AS mn, max(val) AS mx FROM b GROUP BY hour, role, metric, k"
    ]
    for d in SLICES:
        grouped.append(
            f"SELECT hour, role, metric, '{d}:' || b_{d} AS slice, k, count(*), sum(val),"
            f" min(val), max(val) FROM b WHERE b_{d} IS NOT NULL"
            f" GROUP BY hour, role, metric, b_{d}, k"
        )
    grouped_sql = "\nUNION ALL ".join(grouped)
    return f"""
WITH x AS MATERIALIZED ({_x_sql(False, roles)}),
v AS ({values}),
b AS MATERIALIZED (SELECT hour, role, metric, {dims}, val, {_IDX.format(v="val")} AS k FROM v)
{grouped_sql}
"""


def _sketch_select_sql(pg: bool, *, roles: Sequence[str] = ("incumbent", "candidate")) -> str:
    """SELECT of sketch rows (hour, role, metric, slice, count, zero_count, sum, min, max, keys,
    counts) of the ok exchanges of :deployment in [:lo, :hi). Every value's bucket index is
    computed here; the rows aggregate in the database and only sketches come out."""
    if pg:
        grouped = _grouped_pg(roles)
        keys_agg = "coalesce(to_jsonb(array_agg(k ORDER BY k) FILTER (WHERE k IS NOT NULL)), '[]')"
        counts_agg = (
            "coalesce(to_jsonb(array_agg(c ORDER BY k) FILTER (WHERE k IS NOT NULL)), '[]')"
        )
    else:
        grouped = _grouped_sqlite(roles)
        # keys and counts come out in the same row order (one pass over the group's rows)
        keys_agg = "json_group_array(k) FILTER (WHERE k IS NOT NULL)"
        counts_agg = "json_group_array(c) FILTER (WHERE k IS NOT NULL)"
    return f"""
SELECT hour, role, metric, slice, sum(c) AS count,
       coalesce(sum(CASE WHEN k IS NULL THEN c END), 0) AS zero_count,
       sum(sm) AS sum, min(mn) AS min, max(mx) AS max,
       {keys_agg} AS keys, {counts_agg} AS counts
FROM ({grouped}) s
WHERE slice IS NOT NULL
GROUP BY hour, role, metric, slice
"""


ROLLUP_COLUMNS = (
    "deployment, hour, role, metric, slice, count, zero_count, sum, min, max, keys, counts"
)


def _margin(pg: bool, param: str, sign: str) -> str:
    """:param shifted by one hour (candidates may be sent just across an hour boundary)."""
    if pg:
        return f"CAST(:{param} AS timestamptz) {sign} interval '1 hour'"
    return f"strftime('%Y-%m-%d %H:%M:%f000', :{param}, '{sign}1 hour')"


def _sample_insert_sql(pg: bool) -> str:
    """INSERT of each hour's first :k incumbent exchanges in random order (``row_number()
    OVER (PARTITION BY hour ORDER BY random())``), each joined to its candidate by primary key:
    a bounded random sample of the hour's pairs, ranked so readers take any prefix."""
    if pg:
        itl_mean = "(SELECT avg(g) FROM unnest({r}.itl_s) AS g)"
    else:
        itl_mean = "(SELECT avg(je.value) FROM json_each({r}.itl_s) AS je)"
    per_role = []
    for r, alias in (("incumbent", "i"), ("candidate", "c")):
        per_role += [
            f"{alias}.status AS {r}_status",
            f"{alias}.ttft_s AS {r}_ttft_s",
            f"{alias}.tpot_s AS {r}_tpot_s",
            f"{alias}.e2e_s AS {r}_e2e_s",
            f"{_TPS.format(r=alias + '.')} AS {r}_tokens_per_s",
            f"{itl_mean.format(r=alias)} AS {r}_itl_mean_s",
            f"{alias}.completion_tokens AS {r}_completion_tokens",
        ]
    cols = ",\n           ".join(per_role)
    names = ", ".join(SAMPLE_ROLE_COLUMNS)
    hour = _hour_expr(pg, "sent_at")
    return f"""
INSERT INTO latency_samples (deployment, hour, rank, pair_id, sent_at, inflight_incumbent,
                             prompt_tokens, {names})
SELECT :deployment, i.hour, i.rn, i.pair_id, i.sent_at, i.inflight_incumbent, i.prompt_tokens,
       {cols}
FROM (
    SELECT * FROM (
        SELECT {hour} AS hour, row_number() OVER (PARTITION BY {hour} ORDER BY random()) AS rn,
               pair_id, sent_at, status, ttft_s, tpot_s, e2e_s, itl_s, completion_tokens,
               inflight_incumbent, prompt_tokens
        FROM exchanges
        WHERE deployment = :deployment AND role = 'incumbent'
          AND sent_at >= :lo AND sent_at < :hi AND {CLIENT_TRAFFIC_SQL}
    ) ranked
    WHERE rn <= :k
) i
JOIN exchanges c
  ON c.pair_id = i.pair_id AND c.role = 'candidate' AND c.deployment = :deployment
 AND c.sent_at >= {_margin(pg, "lo", "-")} AND c.sent_at < {_margin(pg, "hi", "+")}
"""


def _pair_counts_sql(pg: bool) -> str:
    """Incumbent exchanges (any status) per hour: the weight of each hour's sample."""
    hour = _hour_expr(pg, "sent_at")
    return f"""
SELECT {hour} AS hour, count(*) AS n
FROM exchanges
WHERE deployment = :deployment AND role = 'incumbent' AND sent_at >= :lo AND sent_at < :hi
  AND {CLIENT_TRAFFIC_SQL}
GROUP BY {hour}
"""


# --- refresh ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefreshResult:
    hours_computed: int
    hours_skipped: int
    """Closed hours already rolled up (not recomputed)."""
    chunks: int


def _runs(hours: Sequence[datetime], max_len: int) -> list[tuple[datetime, datetime]]:
    """Contiguous runs of hours as [lo, hi) ranges, each at most ``max_len`` hours."""
    out: list[tuple[datetime, datetime]] = []
    for h in hours:
        if out and out[-1][1] == h and (out[-1][1] - out[-1][0]) < HOUR * max_len:
            out[-1] = (out[-1][0], h + HOUR)
        else:
            out.append((h, h + HOUR))
    return out


def closed_hours(conn: Connection, deployment: str, lo: datetime, hi: datetime) -> set[datetime]:
    rows = conn.execute(
        select(LatencyRollupHour.hour).where(
            LatencyRollupHour.deployment == deployment,
            LatencyRollupHour.hour >= lo,
            LatencyRollupHour.hour < hi,
            LatencyRollupHour.closed.is_(True),
        )
    ).scalars()
    return set(rows)


def _compute_chunk(
    conn: Connection,
    deployment: str,
    lo: datetime,
    hi: datetime,
    *,
    closed_before: datetime,
    sample_per_hour: int,
) -> None:
    pg = _is_pg(conn)
    if pg:
        # this transaction only: the hour GROUP BYs and the pair join fit in memory
        conn.execute(text(f"SET LOCAL work_mem = '{WORK_MEM}'"))
        # JIT compiling these one-off statements costs seconds and saves less
        conn.execute(text("SET LOCAL jit = off"))
        # two refreshes of one deployment (a report and the API) take turns, hour by hour
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:key, hashtext(:deployment))"),
            {"key": _LOCK_KEY, "deployment": deployment},
        )
    for table in (LATENCY_ROLLUPS, LATENCY_SAMPLES, LATENCY_ROLLUP_HOURS):
        c = table.c
        conn.execute(delete(table).where(c.deployment == deployment, c.hour >= lo, c.hour < hi))
    params = {"deployment": deployment, "lo": lo, "hi": hi}
    conn.execute(
        _sql(
            f"INSERT INTO latency_rollups ({ROLLUP_COLUMNS})\n"
            f"SELECT :deployment, hour, role, metric, slice, count, zero_count, sum, min, max,"
            f" keys, counts FROM ({_sketch_select_sql(pg)}) q"
        ),
        {**params, "ln_gamma": LN_GAMMA},
    )
    conn.execute(_sql(_sample_insert_sql(pg)), {**params, "k": sample_per_hour})
    pairs = {h: int(n) for h, n in conn.execute(_sql(_pair_counts_sql(pg), hour=True), params)}
    sampled = {
        h: int(n)
        for h, n in conn.execute(
            _sql(
                "SELECT hour, count(*) AS n FROM latency_samples"
                " WHERE deployment = :deployment AND hour >= :lo AND hour < :hi GROUP BY hour",
                hour=True,
            ),
            params,
        )
    }
    rows = hour_marks(deployment, lo, hi, closed_before, {"n_pairs": pairs, "n_sampled": sampled})
    conn.execute(insert(LatencyRollupHour), rows)


def hour_marks(
    deployment: str,
    lo: datetime,
    hi: datetime,
    closed_before: datetime,
    counts: Mapping[str, Mapping[datetime, int]],
    **constants: Any,
) -> list[dict[str, Any]]:
    """The rows a refresh writes to mark the hours ``[lo, hi)`` of ``deployment`` done: each
    hour's ``counts`` (column -> hour -> count; 0 where absent), the ``constants``, and whether
    the hour is closed (ended by ``closed_before``). The latency and the exchange rollups'
    hour tables both take these."""
    rows = []
    h = lo
    while h < hi:
        rows.append(
            {
                "deployment": deployment,
                "hour": h,
                **{col: by_hour.get(h, 0) for col, by_hour in counts.items()},
                **constants,
                "closed": h + HOUR <= closed_before,
            }
        )
        h += HOUR
    return rows


def refresh_rollups(
    engine: Engine,
    deployment: str,
    window: Window,
    progress: Progress | None = None,
    *,
    now: datetime | None = None,
    grace: timedelta = DEFAULT_GRACE,
    recompute: bool = False,
    sample_per_hour: int = SAMPLE_PER_HOUR,
) -> RefreshResult:
    """Roll up every hour overlapping ``window`` that is not rolled up and closed yet (see the
    module docstring). ``now`` defaults to the wall clock; an hour is closed once it ended
    ``grace`` before ``now``."""
    lo, hi = _check_window(window)
    now = (now or datetime.now(UTC)).astimezone(UTC)
    first, last = floor_hour(lo), ceil_hour(hi)
    with engine.connect() as conn:
        done = set() if recompute else closed_hours(conn, deployment, first, last)
    todo = []
    h = first
    while h < last:
        if h not in done:
            todo.append(h)
        h += HOUR
    runs = _runs(todo, CHUNK_HOURS)
    closed_before = now - grace
    for i, (a, b) in enumerate(runs):
        if progress:
            progress("rollups", i / max(len(runs), 1))
        with engine.begin() as conn:
            _compute_chunk(
                conn,
                deployment,
                a,
                b,
                closed_before=closed_before,
                sample_per_hour=sample_per_hour,
            )
    # the rest of the review's reads (incident detection, data extent, divergence day counts)
    from evaluator.exchange_rollups import refresh_exchange_rollups

    refresh_exchange_rollups(
        engine, deployment, first, last, closed_before=closed_before, recompute=recompute
    )
    if progress:
        progress("rollups", 1.0)
    return RefreshResult(len(todo), len(done), len(runs))


# --- readers ---------------------------------------------------------------------------------


class SketchRow(NamedTuple):
    """One stored (or freshly aggregated) sketch row; ``sign`` -1 for rows to subtract. (A
    named tuple: a month is ~100 k of them, a frozen dataclass costs 3x more to build.)"""

    hour: datetime
    role: str
    metric: str
    slice: str
    n_values: int
    zero_count: int
    sum: float
    min: float | None
    max: float | None
    keys: list[int]
    counts: list[int]
    sign: int = 1


def _json_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, str | bytes):
        loaded: list[int] = orjson.loads(value) or []  # a JSON array of integers
        return loaded
    return list(value)


def _row(r: Any, sign: int = 1) -> SketchRow:
    return SketchRow(
        r[0],
        r[1],
        r[2],
        r[3],
        int(r[4]),
        int(r[5]),
        float(r[6] or 0.0),
        None if r[7] is None else float(r[7]),
        None if r[8] is None else float(r[8]),
        _json_list(r[9]),
        _json_list(r[10]),
        sign,
    )


def raw_sketch_rows(
    conn: Connection,
    deployment: str,
    lo: datetime,
    hi: datetime,
    *,
    roles: Sequence[str] = ("incumbent", "candidate"),
    sign: int = 1,
) -> list[SketchRow]:
    """The rollup aggregation over the raw rows of [lo, hi), returned instead of stored."""
    if hi <= lo:
        return []
    rows = conn.execute(
        _sql(_sketch_select_sql(_is_pg(conn), roles=roles), hour=True),
        {"deployment": deployment, "lo": lo, "hi": hi, "ln_gamma": LN_GAMMA},
    )
    return [_row(r, sign) for r in rows]


def merge_intervals(spans: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def load_sketches(
    engine: Engine,
    deployment: str,
    window: Window,
    *,
    exclude: dict[str, list[tuple[datetime, datetime]]] | None = None,
) -> list[SketchRow]:
    """Sketch rows covering exactly ``window``: stored rollups of the whole hours inside it,
    raw aggregation of the partial hours at its edges, and (sign -1) the raw aggregation of
    every ``exclude[role]`` span within the window, to subtract. (The same rows as
    :func:`load_sketch_columns`, one :class:`SketchRow` each: for a few; a month's ~100 k rows
    are cheaper as columns.)"""
    return load_sketch_columns(engine, deployment, window, exclude=exclude).rows()


@dataclass(frozen=True)
class SketchColumns:
    """Sketch rows as columns, in row order: :class:`SketchRow`'s fields one list or array
    each, the rows' bucket lists laid end to end (row i's are ``keys[start[i]:start[i + 1]]``,
    ``start`` the cumulative ``lengths``). A month of rollups is ~100 k rows and ~10 M buckets:
    as columns they are read and merged by numpy, not row by row in Python."""

    hour: list[datetime]
    role: list[str]
    metric: list[str]
    slice: list[str]
    n_values: npt.NDArray[np.int64]
    zero_count: npt.NDArray[np.int64]
    sum: npt.NDArray[np.float64]
    min: npt.NDArray[np.float64]
    """NaN where the row has none (as ``max``)."""
    max: npt.NDArray[np.float64]
    sign: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.hour)

    @classmethod
    def from_rows(cls, rows: Sequence[SketchRow]) -> SketchColumns:
        def floats(values: Iterable[float | None]) -> npt.NDArray[np.float64]:
            return np.array([math.nan if v is None else v for v in values], dtype=np.float64)

        keys = [k for r in rows for k in r.keys]
        counts = [c for r in rows for c in r.counts]
        if len(keys) != len(counts):
            raise ValueError("sketch rows: keys and counts differ in length")
        return cls(
            hour=[r.hour for r in rows],
            role=[r.role for r in rows],
            metric=[r.metric for r in rows],
            slice=[r.slice for r in rows],
            n_values=np.array([r.n_values for r in rows], dtype=np.int64),
            zero_count=np.array([r.zero_count for r in rows], dtype=np.int64),
            sum=np.array([r.sum for r in rows], dtype=np.float64),
            min=floats(r.min for r in rows),
            max=floats(r.max for r in rows),
            sign=np.array([r.sign for r in rows], dtype=np.int64),
            lengths=np.array([len(r.keys) for r in rows], dtype=np.int64),
            keys=np.array(keys, dtype=np.int64),
            counts=np.array(counts, dtype=np.int64),
        )

    @classmethod
    def concat(cls, parts: Sequence[SketchColumns]) -> SketchColumns:
        def cat(name: str) -> Any:
            arrays = [getattr(p, name) for p in parts if len(getattr(p, name))]
            if len(arrays) == 1:
                return arrays[0]
            return np.concatenate([getattr(p, name) for p in parts])

        return cls(
            hour=[h for p in parts for h in p.hour],
            role=[x for p in parts for x in p.role],
            metric=[x for p in parts for x in p.metric],
            slice=[x for p in parts for x in p.slice],
            **{
                f: cat(f)
                for f in (
                    "n_values",
                    "zero_count",
                    "sum",
                    "min",
                    "max",
                    "sign",
                    "lengths",
                    "keys",
                    "counts",
                )
            },
        )

    def rows(self) -> list[SketchRow]:
        """One :class:`SketchRow` per row."""
        ends = np.cumsum(self.lengths)
        starts = ends - self.lengths
        keys, counts = self.keys.tolist(), self.counts.tolist()
        return [
            SketchRow(
                self.hour[i],
                self.role[i],
                self.metric[i],
                self.slice[i],
                int(self.n_values[i]),
                int(self.zero_count[i]),
                float(self.sum[i]),
                None if math.isnan(self.min[i]) else float(self.min[i]),
                None if math.isnan(self.max[i]) else float(self.max[i]),
                keys[starts[i] : ends[i]],
                counts[starts[i] : ends[i]],
                int(self.sign[i]),
            )
            for i in range(len(self.hour))
        ]


def _int_lists(values: Sequence[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(length of each, all laid end to end) of JSON arrays of integers, as the driver returns
    them: text of PostgreSQL's ``jsonb::text`` (one numpy parse of the whole lot: ~10 M
    integers in half a second) or already lists."""
    if values and all(isinstance(v, str) for v in values):
        # "[1, 2, 3]" as PostgreSQL writes it ("[1,2,3]" SQLite); anything else is counted
        # wrong here, found out by the check below and read value by value
        lengths = np.fromiter(
            (v.count(",") + 1 if len(v) > 2 else 0 for v in values), np.int64, len(values)
        )
        if not lengths.any():
            return lengths, np.empty(0, np.int64)
        try:
            with warnings.catch_warnings():
                # text it cannot read to the end (an error in newer numpy): counted short
                # below, or raised; either way read value by value
                warnings.simplefilter("ignore", DeprecationWarning)
                flat = np.fromstring(
                    ",".join([v[1:-1] for v in values if len(v) > 2]), dtype=np.int64, sep=","
                )
        except ValueError:
            flat = np.empty(0, np.int64)
        if flat.size == int(lengths.sum()):
            return lengths, flat
    lists = [_json_list(v) for v in values]
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    flat = np.array([k for x in lists for k in x], dtype=np.int64)
    return lengths, flat


def _stored_columns(rows: Sequence[Any], dialect: Any | None) -> SketchColumns:
    """:class:`SketchColumns` of stored ``latency_rollups`` rows (hour, role, metric, slice,
    count, zero_count, sum, min, max, keys, counts). ``dialect``: the hours are as the driver
    returns them, to convert as the store's timestamps (None: converted already)."""

    def floats(i: int, none: float) -> npt.NDArray[np.float64]:
        return np.array([none if r[i] is None else r[i] for r in rows], dtype=np.float64)

    # the store's timestamp type, applied once per distinct hour (~700 in ~100 k rows)
    hours: dict[Any, datetime] = {}
    for r in rows:
        if r[0] not in hours:
            hour = r[0] if dialect is None else Timestamp.process_result_value(r[0], dialect)
            if hour is None:
                raise ValueError("latency_rollups: a row without its hour")
            hours[r[0]] = hour

    lengths, keys = _int_lists([r[9] for r in rows])
    count_lengths, counts = _int_lists([r[10] for r in rows])
    if not np.array_equal(lengths, count_lengths):
        raise ValueError("latency_rollups: a row's keys and counts differ in length")
    return SketchColumns(
        hour=[hours[r[0]] for r in rows],
        role=[r[1] for r in rows],
        metric=[r[2] for r in rows],
        slice=[r[3] for r in rows],
        n_values=np.array([int(r[4]) for r in rows], dtype=np.int64),
        zero_count=np.array([int(r[5]) for r in rows], dtype=np.int64),
        sum=floats(6, 0.0),
        min=floats(7, math.nan),
        max=floats(8, math.nan),
        sign=np.ones(len(rows), dtype=np.int64),
        lengths=lengths,
        keys=keys,
        counts=counts,
    )


def load_sketch_columns(
    engine: Engine,
    deployment: str,
    window: Window,
    *,
    exclude: dict[str, list[tuple[datetime, datetime]]] | None = None,
) -> SketchColumns:
    """:func:`load_sketches`' rows as :class:`SketchColumns` (the same rows in the same
    order): :func:`load_stored_sketches`, then :func:`load_raw_sketches`."""
    return SketchColumns.concat(
        [
            load_stored_sketches(engine, deployment, window),
            load_raw_sketches(engine, deployment, window, exclude=exclude),
        ]
    )


def load_stored_sketches(engine: Engine, deployment: str, window: Window) -> SketchColumns:
    """The stored rollups of the whole hours inside ``window`` (the bulk of a month's sketch
    rows; nothing else depends on them, so a caller may read them while it does other work)."""
    lo, hi = _check_window(window)
    inner_lo, inner_hi = ceil_hour(lo), floor_hour(hi)
    parts: list[SketchColumns] = []
    with engine.connect() as conn:
        if inner_lo < inner_hi:
            # JSON columns as text, parsed by numpy at once (the driver's json.loads per
            # value costs ~10x more on a month's ~100 k rows); one fetchall. PostgreSQL's
            # hours are converted once per distinct hour (SQLite's text by the column type)
            pg = _is_pg(conn)
            as_text = "::text" if pg else ""
            stored = conn.execute(
                _sql(
                    "SELECT hour, role, metric, slice, count, zero_count, sum, min, max,"
                    f" keys{as_text} AS keys, counts{as_text} AS counts FROM latency_rollups"
                    " WHERE deployment = :deployment AND hour >= :lo AND hour < :hi",
                    hour=not pg,
                ),
                {"deployment": deployment, "lo": inner_lo, "hi": inner_hi},
            ).all()
            parts.append(_stored_columns(stored, conn.dialect if pg else None))
    parts.append(SketchColumns.from_rows([]))
    return SketchColumns.concat(parts)


def load_raw_sketches(
    engine: Engine,
    deployment: str,
    window: Window,
    *,
    exclude: dict[str, list[tuple[datetime, datetime]]] | None = None,
) -> SketchColumns:
    """The rows :func:`load_sketches` aggregates from the raw exchanges: the window's partial
    hours at its edges (the whole window when it holds no whole hour), then (sign -1) every
    ``exclude[role]`` span within the window, to subtract."""
    lo, hi = _check_window(window)
    inner_lo, inner_hi = ceil_hour(lo), floor_hour(hi)
    raw: list[SketchRow] = []
    with engine.connect() as conn:
        if inner_lo < inner_hi:
            raw += raw_sketch_rows(conn, deployment, lo, inner_lo)
            raw += raw_sketch_rows(conn, deployment, inner_hi, hi)
        else:
            raw += raw_sketch_rows(conn, deployment, lo, hi)
        for role, spans in (exclude or {}).items():
            for a, b in merge_intervals(spans):
                a, b = max(a, lo), min(b, hi)
                if a < b:
                    raw += raw_sketch_rows(conn, deployment, a, b, roles=(role,), sign=-1)
    return SketchColumns.from_rows(raw)


@dataclass(frozen=True)
class SampledPairs:
    """Columns of the sampled pairs (lists of equal length), ``hours_pairs`` the number of
    pairs behind the sample (sum over the window's hours)."""

    columns: dict[str, list[Any]]
    n_pairs_total: int

    def __len__(self) -> int:
        return len(self.columns.get("pair_id", []))


SAMPLE_FIELDS = (
    "hour",
    "pair_id",
    "sent_at",
    "inflight_incumbent",
    "prompt_tokens",
    *SAMPLE_ROLE_COLUMNS,
)


def load_sample(
    engine: Engine, deployment: str, window: Window, *, target: int = 20_000
) -> SampledPairs:
    """About ``target`` sampled pairs of ``window``: from each hour the first
    ``ceil(target * hour_pairs / total_pairs)`` of its random order (a sample proportional to
    the traffic), then only pairs whose incumbent was sent inside the window."""
    lo, hi = _check_window(window)
    first, last = floor_hour(lo), ceil_hour(hi)
    with engine.connect() as conn:
        hours = conn.execute(
            select(LatencyRollupHour.hour, LatencyRollupHour.n_pairs).where(
                LatencyRollupHour.deployment == deployment,
                LatencyRollupHour.hour >= first,
                LatencyRollupHour.hour < last,
            )
        ).all()
        total = sum(int(n) for _, n in hours)
        cols: dict[str, list[Any]] = {f: [] for f in SAMPLE_FIELDS}
        if total == 0:
            return SampledPairs(cols, 0)
        take = {h: math.ceil(target * int(n) / total) for h, n in hours if n}
        # one query: rank <= k for each hour's own k, as a join against a VALUES-like list
        by_k: dict[int, list[datetime]] = {}
        for h, k in take.items():
            by_k.setdefault(k, []).append(h)
        table = LATENCY_SAMPLES
        fields = [table.c[f] for f in SAMPLE_FIELDS]
        for k, hs in by_k.items():
            stmt = (
                select(*fields)
                .where(
                    table.c.deployment == deployment,
                    table.c.hour.in_(bindparam("hours", expanding=True)),
                    table.c.rank <= k,
                    table.c.sent_at >= lo,
                    table.c.sent_at < hi,
                )
                # the same pairs in the same order give the same intervals (seeded bootstrap)
                .order_by(table.c.hour, table.c.pair_id)
            )
            rows = conn.execute(stmt, {"hours": hs}).all()  # one fetch, columns by zip
            if rows:
                for f, values in zip(SAMPLE_FIELDS, zip(*rows, strict=True), strict=True):
                    cols[f].extend(values)
    return SampledPairs(cols, total)


def load_itl(
    engine: Engine,
    deployment: str,
    pair_ids: Sequence[uuid.UUID],
    hours: Sequence[datetime] | None = None,
) -> dict[tuple[uuid.UUID, str], list[float]]:
    """ITL gaps of the given pairs' incumbent and candidate ok exchanges (by primary key).
    ``hours``: each pair's sample hour; the pairs are then read a UTC day at a time, bounded by
    ``sent_at`` so PostgreSQL looks in that day's partitions only (without it every partition
    of the table is searched for every chunk of ids: a scan that grows with the rows)."""
    out: dict[tuple[uuid.UUID, str], list[float]] = {}
    t = EXCHANGES
    by_day: dict[datetime | None, list[uuid.UUID]] = {}
    for i, pid in enumerate(pair_ids):
        day = None if hours is None else floor_hour(hours[i]).replace(hour=0)
        by_day.setdefault(day, []).append(pid)
    with engine.connect() as conn:
        for day, ids in by_day.items():
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                cond = [
                    t.c.pair_id.in_(chunk),
                    t.c.role.in_(("incumbent", "candidate")),
                    t.c.deployment == deployment,
                    t.c.status == "ok",
                ]
                if day is not None:  # the candidate is sent just after: an hour of margin
                    cond += [t.c.sent_at >= day - HOUR, t.c.sent_at < day + 24 * HOUR + HOUR]
                stmt = select(t.c.pair_id, t.c.role, t.c.itl_s).where(*cond)
                for pid, role, itl in conn.execute(stmt):
                    out[(pid, role)] = list(itl or [])
    return out


def raw_role_rows(
    engine: Engine,
    deployment: str,
    role: str,
    lo: datetime,
    hi: datetime,
) -> list[tuple[datetime, float | None, float | None]]:
    """(sent_at, ttft_s, e2e_s) of ``role``'s ok exchanges in [lo, hi), in time order (the
    cold-start look at the first requests after a restart)."""
    t = EXCHANGES
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.sent_at, t.c.ttft_s, t.c.e2e_s)
            .where(
                t.c.deployment == deployment,
                t.c.role == role,
                t.c.status == "ok",
                t.c.sent_at >= lo,
                t.c.sent_at < hi,
            )
            .order_by(t.c.sent_at)
            .limit(10_000)
        ).all()
    return [(s, a, b) for s, a, b in rows]
