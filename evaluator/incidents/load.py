"""Reading what detection needs from the store, bounded: :func:`load_detection_input`.

The SQL runs on PostgreSQL and SQLite. Store failures surface as
:class:`storage.errors.StorageError` (translated here).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    and_,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
)

from evaluator.exchange_rollups import Range, in_ranges, split_window
from evaluator.incidents.model import (
    FAILED_STATUSES,
    ROLES,
    DetectionInput,
    ExchangeEvent,
    HealthPoint,
    IncidentConfig,
    SentCounts,
    Window,
    unix_s,
    utc_at,
    utc_window,
)
from evaluator.rates import observed_intervals
from storage.errors import translate
from storage.models import (
    EXCHANGE_COUNTS,
    EXCHANGE_NOTABLES,
    EXCHANGES,
    HEALTH_SAMPLES,
    client_traffic,
)


def epoch_bin(engine: Engine, column: Any, bin_s: int) -> Any:
    """SQL for ``floor(epoch seconds of column / bin_s)`` on PostgreSQL and SQLite."""
    if engine.dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column) / bin_s), Integer)
    return cast(func.strftime("%s", column), Integer) / bin_s


def role_bin_counts(
    engine: Engine,
    deployment: str,
    split: tuple[Sequence[Range], Sequence[Range]],
    bin_s: int,
    *,
    raw_where: Sequence[Any] = (),
    rolled: str = "n",
    within: Sequence[Range] | None = None,
) -> list[Any]:
    """Statements giving (role, bin, count) of the client exchanges in ``split``: the raw rows
    of its raw ranges that meet ``raw_where``, and the rolled-up minutes of its runs summing
    the ``exchange_counts`` column ``rolled`` (``n``, or ``n_failed`` with a failure filter);
    ``within``: only inside these ranges. Bins are ``bin_s`` wide from the epoch; the caller
    adds the statements' counts up."""
    runs, raw = split
    x, c = EXCHANGES.c, EXCHANGE_COUNTS.c
    out = []
    if raw:
        b = epoch_bin(engine, x.sent_at, bin_s)
        where = [x.deployment == deployment, client_traffic(), in_ranges(x.sent_at, raw)]
        if within is not None:
            where.append(in_ranges(x.sent_at, within))
        out.append(select(x.role, b, func.count()).where(*where, *raw_where).group_by(x.role, b))
    if runs:
        b = epoch_bin(engine, c.minute, bin_s)
        where = [c.deployment == deployment, in_ranges(c.minute, runs)]
        if within is not None:
            where.append(in_ranges(c.minute, within))
        out.append(select(c.role, b, func.sum(c[rolled])).where(*where).group_by(c.role, b))
    return out


def gap_at_least(engine: Engine, seconds: float) -> Any:
    """SQL: some inter-token gap of the exchange is at least ``seconds`` (short-circuits, 15x
    cheaper than taking the maximum on PostgreSQL)."""
    s = repr(float(seconds))
    if engine.dialect.name == "postgresql":
        return literal_column(f"({s} <= ANY(exchanges.itl_s))")
    return literal_column(f"EXISTS (SELECT 1 FROM json_each(exchanges.itl_s) WHERE value >= {s})")


def max_itl(engine: Engine) -> Any:
    """SQL for the largest inter-token gap of an exchange (``itl_s`` array/JSON)."""
    if engine.dialect.name == "postgresql":
        return literal_column("(SELECT max(x) FROM unnest(exchanges.itl_s) AS x)")
    return literal_column("(SELECT max(value) FROM json_each(exchanges.itl_s))")


MAX_COUNT_RANGES = 100
"""Most time ranges the per-minute counts around failures are read in (closest merged)."""


def spans_around(
    times: Sequence[float], pad_s: float, lo: float, hi: float, max_spans: int
) -> list[tuple[float, float]]:
    """Minute-aligned ``[t - pad, t + pad]`` around each time, merged, clipped to ``[lo, hi]``,
    at most ``max_spans`` (the closest neighbours merged first)."""
    spans: list[tuple[float, float]] = []
    for t in sorted(times):
        a = max(lo, math.floor((t - pad_s) / 60.0) * 60.0)
        b = min(hi, math.ceil((t + pad_s) / 60.0) * 60.0)
        if spans and a <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b))
        elif b > a:
            spans.append((a, b))
    if len(spans) > max_spans:
        gaps = sorted(spans[k + 1][0] - spans[k][1] for k in range(len(spans) - 1))
        limit = gaps[len(spans) - max_spans - 1]
        merged = [spans[0]]
        for a, b in spans[1:]:
            if a - merged[-1][1] <= limit:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        spans = merged
    return spans


def burst_candidates(events: Sequence[ExchangeEvent], config: IncidentConfig) -> list[float]:
    """Times of failures that start a ``burst_window_s`` window holding at least
    ``burst_min_errors`` failures of one engine: the only places an error burst can be, so the
    only places the per-minute sent counts are needed."""
    by_engine: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.status in FAILED_STATUSES:
            by_engine[e.engine].append(unix_s(e.sent_at))
    out: list[float] = []
    k = max(1, config.burst_min_errors)
    for times in by_engine.values():
        times.sort()
        out.extend(
            times[i]
            for i in range(len(times) - k + 1)
            if times[i + k - 1] - times[i] < config.burst_window_s
        )
    return out


def _failed(timeout_s: float) -> Any:
    """SQL: the exchange failed, or (the incumbent, whose answer the mirror never cuts) ran past
    the shadow timeout: both roles censored alike."""
    x = EXCHANGES.c
    return or_(
        x.status.in_(FAILED_STATUSES),
        and_(x.role == "incumbent", x.status == "ok", x.e2e_s >= timeout_s),
    )


def _count_failures(
    engine: Engine,
    conn: Connection,
    deployment: str,
    split: tuple[list[Range], list[Range]],
    timeout_s: float,
) -> Counter[tuple[str, int]]:
    """Failed exchanges per (role, day): the rolled-up hours' failed counts and censored
    incumbent answers (notables), the raw rows elsewhere."""
    runs, _ = split
    n = EXCHANGE_NOTABLES.c
    out: Counter[tuple[str, int]] = Counter()
    queries = role_bin_counts(
        engine, deployment, split, 86400, raw_where=[_failed(timeout_s)], rolled="n_failed"
    )
    if runs:
        day = epoch_bin(engine, n.sent_at, 86400)
        censored = and_(n.role == "incumbent", n.status == "ok", n.e2e_s >= timeout_s)
        queries.append(
            select(n.role, day, func.count())
            .where(n.deployment == deployment, in_ranges(n.sent_at, runs), censored)
            .group_by(n.role, day)
        )
    for q in queries:
        for role, d, k in conn.execute(q):
            out[(role, int(d))] += int(k or 0)
    return +out


DEFAULT_SHADOW_TIMEOUT_S = 120.0
"""The mirror's default ``shadow.timeout_s``."""
_TIMEOUT_RE = re.compile(r"within ([0-9.]+)\s*s")


def shadow_timeout(conn: Connection, deployment: str, config: IncidentConfig) -> float:
    """The shadow timeout both roles are censored at: the configured one, else the one the
    mirror wrote into the candidate's timeout errors ("no complete answer within 120.0s"),
    else the mirror's default."""
    if config.shadow_timeout_s is not None:
        return float(config.shadow_timeout_s)
    n = EXCHANGE_NOTABLES.c  # every timeout of a rolled-up hour is there
    error = conn.execute(
        select(n.error)
        .where(n.deployment == deployment, n.role == "candidate", n.status == "timeout")
        .limit(1)
    ).scalar()
    if error is None:
        _, raw = split_window(conn, deployment, None)
        x = EXCHANGES.c
        error = conn.execute(
            select(x.error)
            .where(
                x.deployment == deployment,
                client_traffic(),
                x.role == "candidate",
                x.status == "timeout",
                in_ranges(x.sent_at, raw),
            )
            .limit(1)
        ).scalar()
    match = _TIMEOUT_RE.search(error or "")
    return float(match.group(1)) if match else DEFAULT_SHADOW_TIMEOUT_S


MAX_EVENTS = 200_000
"""Most notable exchanges one detection loads (a systematically failing engine would
otherwise load every row); beyond it the section says the data was truncated."""


def load_detection_input(
    engine: Engine,
    deployment: str,
    window: Window,
    config: IncidentConfig = IncidentConfig(),
    *,
    max_events: int = MAX_EVENTS,
) -> DetectionInput:
    """Read what detection needs, bounded: health samples where something changed, and the
    sample just before each change (LAG/LEAD in SQL), memory in ``leak_bin_s`` bins, exchanges
    sent per role (an index-only count) and per minute only around failures, and only the
    exchanges that failed, timed out or stalled (one filtered pass; the inter-token gaps are
    looked at only for answers that lasted at least ``hang_stall_s``)."""
    lo, hi = utc_window(window)
    h = HEALTH_SAMPLES.c
    iteration = h.metrics["iter"].as_float()
    prev = {
        "up": func.lag(h.up).over(partition_by=h.engine, order_by=h.ts),
        "next_up": func.lead(h.up).over(partition_by=h.engine, order_by=h.ts),
        "pst": func.lag(h.process_start_time).over(partition_by=h.engine, order_by=h.ts),
        "next_pst": func.lead(h.process_start_time).over(partition_by=h.engine, order_by=h.ts),
        "version": func.lag(h.version).over(partition_by=h.engine, order_by=h.ts),
        "first": func.lag(h.ts).over(partition_by=h.engine, order_by=h.ts),
        "iter": func.lag(iteration).over(partition_by=h.engine, order_by=h.ts),
        "next_iter": func.lead(iteration).over(partition_by=h.engine, order_by=h.ts),
    }
    inner = (
        select(
            h.engine,
            h.role,
            h.ts,
            h.up,
            h.http_status,
            h.latency_s,
            h.error,
            h.version,
            h.process_start_time,
            iteration.label("iteration"),
            *(v.label(f"prev_{k}") for k, v in prev.items()),
        )
        .where(h.deployment == deployment, h.ts >= lo, h.ts < hi)
        .subquery()
    )
    q = inner.c
    changes = (
        select(
            q.engine,
            q.role,
            q.ts,
            q.up,
            q.http_status,
            q.latency_s,
            q.error,
            q.version,
            q.process_start_time,
            q.iteration,
        )
        .where(
            or_(
                q.prev_first.is_(None),
                q.up.is_(False),
                q.prev_up.is_(False),
                q.prev_next_up.is_(False),
                q.process_start_time.is_distinct_from(q.prev_pst),
                # The sample before a new process start time: a restart faster than a scrape
                # (no down samples) started after it, not at the previous change days before.
                and_(
                    q.prev_next_pst.is_not(None),
                    q.prev_next_pst.is_distinct_from(q.process_start_time),
                ),
                q.version.is_distinct_from(q.prev_version),
                q.iteration < q.prev_iter,
                q.prev_next_iter < q.iteration,
                q.latency_s >= config.hang_health_latency_s,
            )
        )
        .order_by(q.engine, q.ts)
    )
    mem_bin = epoch_bin(engine, h.ts, max(1, round(config.leak_bin_s)))  # whole seconds
    up_only = h.up.is_(True)
    memory_q = (  # also tells when the engine was watched: every scrape falls in some bin
        select(
            h.engine,
            func.max(h.role),
            func.min(h.ts),
            func.max(h.ts),
            func.avg(case((up_only, h.gpu_mem_bytes))),
            func.avg(case((up_only, h.cpu_mem_bytes))),
        )
        .where(h.deployment == deployment, h.ts >= lo, h.ts < hi)
        .group_by(h.engine, mem_bin)
    )
    x, c, nt = EXCHANGES.c, EXCHANGE_COUNTS.c, EXCHANGE_NOTABLES.c
    with translate(), engine.connect() as conn:
        timeout_s = shadow_timeout(conn, deployment, config)
        # The closed, rolled-up hours are read from the exchange rollups, the rest raw
        # (evaluator/exchange_rollups.py); the notables only while the thresholds are at or
        # above the floors they were kept at.
        runs, raw = split_window(conn, deployment, (lo, hi))
        event_split = split_window(
            conn, deployment, (lo, hi), stall_s=config.hang_stall_s, timeout_s=timeout_s
        )
    # Per role: an index-only scan of (deployment, role, sent_at), parallel on PostgreSQL.
    sent_day = epoch_bin(engine, x.sent_at, 86400)
    totals_qs = []
    if raw:
        totals_qs.append(
            select(x.role, sent_day, func.count(), func.min(x.sent_at), func.max(x.sent_at))
            .where(x.deployment == deployment, client_traffic(), in_ranges(x.sent_at, raw))
            .group_by(x.role, sent_day)
        )
    if runs:
        minute_day = epoch_bin(engine, c.minute, 86400)
        totals_qs.append(
            select(c.role, minute_day, func.sum(c.n), func.min(c.first_sent), func.max(c.last_sent))
            .where(c.deployment == deployment, in_ranges(c.minute, runs))
            .group_by(c.role, minute_day)
        )
    itl = max_itl(engine)
    events_qs = []
    if event_split[1]:
        events_qs.append(
            select(
                x.engine,
                x.role,
                x.sent_at,
                x.status,
                x.http_status,
                x.error,
                x.ttft_s,
                x.e2e_s,
                itl.label("max_itl"),
            )
            .where(
                x.deployment == deployment,
                client_traffic(),
                in_ranges(x.sent_at, event_split[1]),
                or_(
                    x.status != "ok",
                    x.ttft_s >= config.hang_stall_s,
                    x.e2e_s >= timeout_s,
                    # A gap that long makes the whole answer at least that long: the cheap test
                    # first, the per-row array scan only for the few that pass it.
                    and_(x.e2e_s >= config.hang_stall_s, gap_at_least(engine, config.hang_stall_s)),
                ),
            )
            .order_by(x.sent_at)
            .limit(max_events + 1)
        )
    if event_split[0]:
        events_qs.append(
            select(nt.engine, nt.role, nt.sent_at, nt.status, nt.http_status, nt.error)
            .add_columns(nt.ttft_s, nt.e2e_s, nt.max_itl_s)
            .where(
                nt.deployment == deployment,
                in_ranges(nt.sent_at, event_split[0]),
                or_(  # the same test as the raw rows', on the notables' columns
                    nt.status != "ok",
                    nt.ttft_s >= config.hang_stall_s,
                    nt.e2e_s >= timeout_s,
                    and_(nt.e2e_s >= config.hang_stall_s, nt.max_itl_s >= config.hang_stall_s),
                ),
            )
            .order_by(nt.sent_at)
            .limit(max_events + 1)
        )
    with translate(), engine.connect() as conn:
        health = [
            HealthPoint(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6], r[7], r[8], iteration=r[9])
            for r in conn.execute(changes)
        ]
        memory = []
        seen: dict[str, list[float]] = defaultdict(list)
        for r in conn.execute(memory_q):
            first, last = unix_s(r[2]), unix_s(r[3])
            seen[r[0]] += [first, last]
            if r[4] is None and r[5] is None:
                continue
            memory.append(
                HealthPoint(
                    r[0],
                    r[1],
                    utc_at((first + last) / 2),
                    True,
                    gpu_mem_bytes=None if r[4] is None else int(r[4]),
                    cpu_mem_bytes=None if r[5] is None else int(r[5]),
                )
            )
        sent = SentCounts(60.0, by_role=True)
        role_sent: Counter[str] = Counter()
        sent_by_day: Counter[tuple[str, int]] = Counter()
        for totals_q in totals_qs:
            for role, day, k, first, last in conn.execute(totals_q):
                role_sent[role] += int(k)
                sent_by_day[(role, int(day))] += int(k)
                key = sent.key("", role)
                a, b = unix_s(first), unix_s(last)
                old = sent.extent.get(key, (a, b))
                sent.extent[key] = (min(a, old[0]), max(b, old[1]))
                sent.totals[key] = sent.totals.get(key, 0) + int(k)
        rows = [r for q in events_qs for r in conn.execute(q)]
        if len(events_qs) > 1:
            rows.sort(key=lambda r: r[2])
        events = [_censored(r, timeout_s) for r in rows[: max_events + 1]]
        # Exchanges sent per minute, only around failures (where an error burst could be).
        ranges = spans_around(
            burst_candidates(events, config),
            config.burst_window_s + 60.0,
            unix_s(lo),
            unix_s(hi),
            MAX_COUNT_RANGES,
        )
        counted: dict[str, Counter[int]] = defaultdict(Counter)
        if ranges:
            near = [(utc_at(a), utc_at(b)) for a, b in ranges]  # whole minutes
            bins_qs = role_bin_counts(engine, deployment, (runs, raw), 60, within=near)
            for bins_q in bins_qs:
                for role, b, k in conn.execute(bins_q):
                    counted[sent.key("", role)][int(b)] += int(k)
        binned = SentCounts.from_bins(counted, 60.0)
        sent.bins = binned.bins
        truncated = len(events) > max_events
        if truncated:
            failed_by_day = _count_failures(engine, conn, deployment, event_split, timeout_s)
        else:
            failed_by_day = Counter(
                (e.role, int(unix_s(e.sent_at) // 86400))
                for e in events
                if e.status in FAILED_STATUSES
            )
    failed_by_role: Counter[str] = Counter()
    for (role, _), n in failed_by_day.items():
        failed_by_role[role] += n
    outcomes = {
        role: {"sent": role_sent.get(role, 0), "failed": int(failed_by_role.get(role, 0))}
        for role in ROLES
    }
    outcomes_by_day = {
        role: {
            day: (n, int(failed_by_day.get((role, day), 0)))
            for (r, day), n in sorted(sent_by_day.items())
            if r == role
        }
        for role in ROLES
    }
    role_of: dict[str, str] = {}
    for e in events:
        if e.role in ROLES and role_of.get(e.engine) != "incumbent":
            role_of[e.engine] = e.role
    observed = {eng: observed_intervals(ts, config.health_max_gap_s) for eng, ts in seen.items()}
    return DetectionInput(
        health=health,
        events=events[:max_events],
        sent=sent,
        memory=memory,
        observed=observed,
        role_of=role_of,
        truncated=truncated,
        outcomes=outcomes,
        outcomes_by_day=outcomes_by_day,
        shadow_timeout_s=timeout_s,
    )


def _censored(r: Any, timeout_s: float) -> ExchangeEvent:
    """The exchange event of a row; an incumbent answer that ran past the shadow timeout is
    the timeout the candidate would have had (both roles censored alike)."""
    status, error = r[3], r[5]
    if r[1] == "incumbent" and status == "ok" and r[7] is not None and r[7] >= timeout_s:
        status = "timeout"
        error = (
            f"ran {r[7]:.1f}s, past the shadow timeout of {timeout_s:g}s: censored there as"
            " the candidate's answer is"
        )
    return ExchangeEvent(r[0], r[1], r[2], status, r[4], error, r[6], r[7], r[8])
