"""Reading stored incidents: the one place ``shadow-ab incidents`` and the query API get them.

- :func:`query_incidents`: the stored incidents of a deployment, filtered, as JSON-able dicts;
- :func:`compare_incidents`: counts per day or ISO week per role, rates per observed day and the
  exact comparison of the candidate's rate with the incumbent's (conditional binomial test,
  :func:`evaluator.rates.compare_poisson_rates`), per bucket and over the whole span.

Both read what detection stored (``shadow-ab report`` or ``shadow-ab incidents --detect`` run
it); exposure (observed time) comes from the health samples' minutes, or from the minutes with
exchanges for a role without health samples.

Errors (:mod:`evaluator.errors`): :class:`~evaluator.errors.UnknownDeployment` (``known`` lists
the ones that exist), :class:`~evaluator.errors.BadQuery` (an argument that cannot work: ``by``,
a naive time, ...).

Store failures surface as :class:`storage.errors.StorageError`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, func, select

from evaluator.errors import BadQuery, UnknownDeployment
from evaluator.incidents.analysis import bucket_table, role_intervals
from evaluator.incidents.load import epoch_bin
from evaluator.incidents.model import KINDS, ROLES, Finding, SentCounts
from evaluator.rates import (
    BUCKETS,
    By,
    bucket_length,
    compare_poisson_rates,
    observed_intervals,
    overlap_s,
)
from shadow_ab.timestamps import aware_utc
from storage.errors import translate
from storage.models import DEPLOYMENTS, EXCHANGES, HEALTH_SAMPLES, INCIDENTS

DEFAULT_MAX_GAP_S = 120.0


def known_deployments(engine: Engine) -> list[str]:
    with translate(), engine.connect() as conn:
        return [r[0] for r in conn.execute(select(DEPLOYMENTS.c.name).order_by(DEPLOYMENTS.c.name))]


def check_deployment(engine: Engine, deployment: str) -> None:
    with translate(), engine.connect() as conn:
        found = conn.execute(
            select(DEPLOYMENTS.c.name).where(DEPLOYMENTS.c.name == deployment)
        ).first()
    if found is None:
        raise UnknownDeployment(deployment, known_deployments(engine))


def _utc(ts: datetime | None, name: str) -> datetime | None:
    if ts is None:
        return None
    try:
        return aware_utc(ts, name)
    except ValueError as exc:
        raise BadQuery(str(exc)) from None


def _row_dict(r: Any) -> dict[str, Any]:
    evidence = dict(r.evidence or {})
    started, ended = r.started_at, r.ended_at
    return {
        "id": r.id,
        "deployment": r.deployment,
        "engine": r.engine,
        "role": evidence.get("role"),
        "kind": r.kind,
        "started_at": started.isoformat(),
        "ended_at": ended.isoformat() if ended else None,
        "duration_s": (ended - started).total_seconds() if ended else None,
        "evidence": evidence,
        "detected_at": r.detected_at.isoformat() if r.detected_at else None,
    }


def query_incidents(
    engine: Engine,
    deployment: str,
    *,
    engine_role: str | None = None,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[dict[str, Any]]:
    """Stored incidents of ``deployment`` that started in ``[since, until)``, oldest first.

    ``engine_role`` matches an engine id (``trtllm@candidate``) or a role (``candidate``);
    ``kind`` one of crash, version_change, leak, error_burst, hang. Each dict: id, deployment,
    engine, role, kind, started_at, ended_at (ISO 8601 UTC or None), duration_s, evidence,
    detected_at."""
    if kind is not None and kind not in KINDS:
        raise BadQuery(f"unknown incident kind {kind!r}: use one of {', '.join(KINDS)}")
    since, until = _utc(since, "since"), _utc(until, "until")
    check_deployment(engine, deployment)
    c = INCIDENTS.c
    q = select(INCIDENTS).where(c.deployment == deployment)
    if kind is not None:
        q = q.where(c.kind == kind)
    if since is not None:
        q = q.where(c.started_at >= since)
    if until is not None:
        q = q.where(c.started_at < until)
    with translate(), engine.connect() as conn:
        rows = [_row_dict(r) for r in conn.execute(q.order_by(c.started_at, c.engine, c.kind))]
    if engine_role is not None:
        rows = [r for r in rows if engine_role in (r["engine"], r["role"])]
    return rows


def data_span(engine: Engine, deployment: str) -> tuple[datetime, datetime] | None:
    """First and last moment of the deployment's health samples, exchanges and incidents."""
    firsts, lasts = [], []
    with translate(), engine.connect() as conn:
        for table, col in (
            (HEALTH_SAMPLES, "ts"),
            (EXCHANGES, "sent_at"),
            (INCIDENTS, "started_at"),
        ):
            column = table.c[col]
            lo, hi = conn.execute(
                select(func.min(column), func.max(column)).where(table.c.deployment == deployment)
            ).one()
            if lo is not None:
                firsts.append(lo)
                lasts.append(hi)
    if not firsts:
        return None
    return min(firsts), max(lasts)


def load_exposure(
    engine: Engine,
    deployment: str,
    since: datetime,
    until: datetime,
    max_gap_s: float = DEFAULT_MAX_GAP_S,
) -> dict[str, list[tuple[float, float]]]:
    """Observed intervals per role (Unix seconds): minutes with health samples, joined across
    gaps up to ``max_gap_s``; for a role without health samples, minutes with exchanges."""
    h, x = HEALTH_SAMPLES.c, EXCHANGES.c
    hb = epoch_bin(engine, h.ts, 60)
    health_q = (
        select(h.engine, func.max(h.role), hb)
        .where(h.deployment == deployment, h.ts >= since, h.ts < until)
        .group_by(h.engine, hb)
    )
    seen: dict[str, list[float]] = defaultdict(list)
    role_of: dict[str, str] = {}
    with translate(), engine.connect() as conn:
        for eng, role, b in conn.execute(health_q):
            seen[eng].append(float(b) * 60.0)
            role_of[eng] = role
        missing = [r for r in ROLES if r not in role_of.values()]
        sent = SentCounts(60.0)
        if missing:
            xb = epoch_bin(engine, x.sent_at, 60)
            sent_q = (
                select(x.engine, x.role, xb, func.count())
                .where(
                    x.deployment == deployment,
                    x.sent_at >= since,
                    x.sent_at < until,
                    x.role.in_(missing),
                )
                .group_by(x.engine, x.role, xb)
            )
            counted: dict[str, Counter[int]] = defaultdict(Counter)
            for eng, role, b, n in conn.execute(sent_q):
                counted[eng][int(b)] += int(n)
                role_of.setdefault(eng, role)
            sent = SentCounts.from_bins(counted, 60.0)
    observed = {
        eng: [(a, b + 60.0) for a, b in observed_intervals(ts, max_gap_s)]
        for eng, ts in seen.items()
    }
    return role_intervals(observed, role_of, sent, max_gap_s)


def _finding(row: dict[str, Any]) -> Finding:
    return Finding(
        engine=row["engine"],
        role=row["role"] or "",
        kind=row["kind"],
        started_at=datetime.fromisoformat(row["started_at"]),
        ended_at=datetime.fromisoformat(row["ended_at"]) if row["ended_at"] else None,
        evidence=row["evidence"],
    )


def compare_incidents(
    engine: Engine,
    deployment: str,
    *,
    by: By = "day",
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    level: float = 0.95,
    max_buckets: int | None = None,
) -> dict[str, Any]:
    """Stored incidents counted per ``by`` bucket and role, with rates per observed day and
    the exact candidate/incumbent rate comparison per bucket and overall.

    ``max_buckets``: a window with more buckets than this raises :class:`BadQuery` (the
    answer, and the time and memory to build it, grow with the number of buckets).

    ``since``/``until`` default to the deployment's data (health samples, exchanges,
    incidents). Returned dict::

        deployment, by, kind, since, until, kinds,
        roles: {incumbent|candidate: {engines, count, counts {kind: n}, exposure_days,
                                      rate_per_day}},
        comparison: {x1, t1, x2, t2, rate1, rate2, ratio, interval {low, high, level},
                     p_value, method} | None   (x1/t1 = candidate, x2/t2 = incumbent),
        buckets: [{bucket, start, incumbent {...}, candidate {...}, comparison}, ...]
    """
    if by not in BUCKETS:
        raise BadQuery(f"--by must be one of {', '.join(BUCKETS)}, got {by!r}")
    rows = query_incidents(engine, deployment, kind=kind, since=since, until=until)
    since_u, until_u = _utc(since, "since"), _utc(until, "until")
    if since_u is None or until_u is None:
        span = data_span(engine, deployment)
        if span is None:
            span = (since_u or datetime.now(UTC), until_u or datetime.now(UTC))
        since_u = since_u or span[0]
        # The window is [since, until): end just past the last data point, so an incident
        # starting at that very moment is in the buckets as well as in the totals.
        until_u = until_u or span[1] + timedelta(microseconds=1)
        if until_u <= since_u:
            until_u = since_u + (span[1] - span[0]) if span[1] > span[0] else since_u
    if until_u <= since_u:
        return _empty(deployment, by, kind, since_u, until_u)
    if max_buckets is not None:
        n = (until_u - since_u) // bucket_length(by) + 1
        if n > max_buckets:
            raise BadQuery(
                f"the window {since_u.date()} .. {until_u.date()} spans about {n} {by}"
                f" buckets, more than the {max_buckets} one answer holds: narrow it with"
                f" since/until{', or ask by=week' if by == 'day' else ''}"
            )
    findings = [_finding(r) for r in rows]
    exposure = load_exposure(engine, deployment, since_u, until_u)
    lo, hi = since_u.timestamp(), until_u.timestamp()
    kinds = [kind] if kind else list(KINDS)
    roles: dict[str, Any] = {}
    for role in ROLES:
        days = overlap_s(exposure.get(role, ()), lo, hi) / 86400.0
        mine = [f for f in findings if f.role == role]
        roles[role] = {
            "engines": sorted({f.engine for f in mine}),
            "count": len(mine),
            "counts": {k: sum(1 for f in mine if f.kind == k) for k in kinds},
            "exposure_days": days,
            "rate_per_day": len(mine) / days if days > 0 else None,
        }
    t1, t2 = roles["candidate"]["exposure_days"], roles["incumbent"]["exposure_days"]
    comparison = (
        compare_poisson_rates(
            roles["candidate"]["count"], t1, roles["incumbent"]["count"], t2, level
        ).to_dict()
        if t1 > 0 and t2 > 0
        else None
    )
    return {
        "deployment": deployment,
        "by": by,
        "kind": kind,
        "kinds": kinds,
        "since": since_u.isoformat(),
        "until": until_u.isoformat(),
        "roles": roles,
        "comparison": comparison,
        "buckets": bucket_table(findings, exposure, (since_u, until_u), by, kinds, level),
    }


def _empty(
    deployment: str, by: str, kind: str | None, since: datetime, until: datetime
) -> dict[str, Any]:
    kinds = [kind] if kind else list(KINDS)
    return {
        "deployment": deployment,
        "by": by,
        "kind": kind,
        "kinds": kinds,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "roles": {
            role: {
                "engines": [],
                "count": 0,
                "counts": dict.fromkeys(kinds, 0),
                "exposure_days": 0.0,
                "rate_per_day": None,
            }
            for role in ROLES
        },
        "comparison": None,
        "buckets": [],
    }
