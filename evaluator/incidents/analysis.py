"""The incidents of one window, and the section of the review that compares the engines.

:func:`detect_incidents` is pure: every incident in a :class:`DetectionInput` (restarts from
:mod:`evaluator.incidents.restarts`, the rest from :mod:`evaluator.incidents.exchanges`), with
error bursts and hangs inside a crash (± ``crash_margin_s``) folded into the crash.
:func:`incident_section` compares the engines' incident rates per observed day and their
failure shares (measurement keys ``incidents.*`` and ``errors.rate_ratio``). Neither reads nor
writes the store: the review loads (:func:`evaluator.incidents.load.load_detection_input`),
detects, stores (:func:`evaluator.incidents.store.store_incidents`) and builds the section.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evaluator.incidents.exchanges import (
    detect_exchange_incidents,
    detect_health_hangs,
    detect_leaks,
    merge_findings,
)
from evaluator.incidents.leak import Slope, trend
from evaluator.incidents.memory import MemoryComparison, compare_memory
from evaluator.incidents.model import (
    KINDS,
    MEMORY_SERIES,
    ROLES,
    DetectionInput,
    Finding,
    HealthPoint,
    IncidentConfig,
    SentCounts,
    Window,
    unix_s,
    utc_window,
)
from evaluator.incidents.restarts import detect_restarts, process_starts, restart_times
from evaluator.incidents.upgrades import upgrade_table
from evaluator.rates import (
    By,
    RateComparison,
    bucket_label,
    bucket_length,
    buckets_between,
    compare_dispersed_rates,
    compare_failure_shares,
    compare_poisson_rates,
    overlap_s,
    rate_measurement,
)
from evaluator.results import Interval, Measurement


def detect_incidents(
    data: DetectionInput, config: IncidentConfig = IncidentConfig()
) -> list[Finding]:
    """Every incident in ``data``, oldest first (pure: nothing read or written). Bursts and
    hangs seen by both health and exchanges are one incident each; those inside a crash belong
    to the crash."""
    roles = data.roles()
    memory = data.memory_by_engine()
    observed = data.observed_by_engine(config.health_max_gap_s)
    health_findings: list[Finding] = []
    for eng, pts in data.health_by_engine().items():
        found = detect_restarts(pts, config)
        health_findings.extend(found)
        starts = process_starts(pts, found)
        health_findings.extend(detect_leaks(memory.get(eng, []), starts, config))
        health_findings.extend(detect_health_hangs(pts, config))
    for eng, pts in memory.items():
        if eng not in observed and pts:
            health_findings.extend(detect_leaks(pts, [], config))
    ex_findings, extra = detect_exchange_incidents(
        data.events, data.sent, health_findings, roles, observed, config
    )
    attached = extra["crash_connection_errors"]
    findings = []
    for f in health_findings:
        n = attached.get(f.engine, {}).get(f.started_at.isoformat())
        if n:
            f = replace(f, evidence={**f.evidence, "connection_errors": n})
        findings.append(replace(f, role=roles.get(f.engine, f.role)))
    findings.extend(ex_findings)
    # Bursts and hangs seen by both health and exchanges are one incident each; anything of
    # those inside a crash belongs to the crash.
    merged = merge_findings(
        [f for f in findings if f.kind in ("error_burst", "hang")], config.cluster_gap_s
    )
    horizon = max((unix_s(f.end_or_start) for f in findings), default=0.0) + 1.0
    crash_spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in findings:
        if f.kind == "crash" or (f.kind == "version_change" and f.evidence.get("restart")):
            crash_spans[f.engine].append(
                (unix_s(f.started_at), unix_s(f.ended_at) if f.ended_at else horizon)
            )
    kept = [
        f
        for f in merged
        if not any(
            a - config.crash_margin_s <= unix_s(f.started_at)
            and unix_s(f.end_or_start) <= b + config.crash_margin_s
            for a, b in crash_spans[f.engine]
        )
    ]
    rest = [f for f in findings if f.kind not in ("error_burst", "hang")]
    return sorted([*rest, *kept], key=lambda f: (f.started_at, f.engine, f.kind))


def memory_trends(
    points: Sequence[HealthPoint],
    restarts: Sequence[float],
    config: IncidentConfig = IncidentConfig(),
) -> dict[str, Slope]:
    """Each memory series' overall slope (longest piece between restarts), for the report."""
    out: dict[str, Slope] = {}
    for series in MEMORY_SERIES:
        pairs = [
            (unix_s(p.ts), getattr(p, series)) for p in points if getattr(p, series) is not None
        ]
        if pairs:
            t, y = zip(*pairs, strict=True)
            s = trend(t, y, restarts, config.leak_params)
            if s is not None:
                out[series] = s
    return out


def role_intervals(
    observed: Mapping[str, Sequence[tuple[float, float]]],
    role_of: Mapping[str, str],
    sent: SentCounts | None = None,
    max_gap_s: float = 120.0,
) -> dict[str, list[tuple[float, float]]]:
    """Observed time per role: the union of its engines' health-watched intervals; a role with
    no health samples falls back to when it received exchanges (:meth:`SentCounts.spans`)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for role in ROLES:
        engines = [e for e, r in role_of.items() if r == role]
        spans = [s for e in engines for s in observed.get(e, ())]
        if not spans and sent is not None:
            keys = [role] if sent.by_role else engines
            spans = [s for k in keys for s in sent.spans(k, max_gap_s)]
        merged: list[tuple[float, float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        out[role] = merged
    return out


def bucket_table(
    findings: Sequence[Finding],
    exposure: Mapping[str, Sequence[tuple[float, float]]],
    window: Window,
    by: By,
    kinds: Sequence[str] = KINDS,
    level: float = 0.95,
) -> list[dict[str, Any]]:
    """Per day or ISO week: each role's incident counts per kind, observed days and rate per
    day, and the exact comparison of all incidents' rates (candidate / incumbent)."""
    lo, hi = utc_window(window)
    rows = []
    for b in buckets_between(lo, hi, by):
        b_end = b + bucket_length(by)
        s, e = max(unix_s(b), unix_s(lo)), min(unix_s(b_end), unix_s(hi))
        row: dict[str, Any] = {"bucket": bucket_label(b, by), "start": b.isoformat()}
        totals = {}
        for role in ROLES:
            days = overlap_s(exposure.get(role, ()), s, e) / 86400.0
            counts = {
                k: sum(
                    1
                    for f in findings
                    if f.role == role and f.kind == k and s <= unix_s(f.started_at) < e
                )
                for k in kinds
            }
            n = sum(counts.values())
            totals[role] = (n, days)
            row[role] = {
                "counts": counts,
                "total": n,
                "exposure_days": days,
                "rate_per_day": n / days if days > 0 else None,
            }
        (x1, t1), (x2, t2) = totals["candidate"], totals["incumbent"]
        row["comparison"] = (
            compare_poisson_rates(x1, t1, x2, t2, level).to_dict() if t1 > 0 and t2 > 0 else None
        )
        rows.append(row)
    return rows


def episodes(findings: Sequence[Finding], gap_s: float) -> list[Finding]:
    """The findings as episodes: per role and kind, an incident starting within ``gap_s`` of
    the end of the previous one joins its episode (a crash loop of ten restarts, or a run of
    hangs over one bad hour, is one event). Each episode is its first finding, its evidence
    saying how many incidents it holds."""
    out: list[Finding] = []
    last: dict[tuple[str, str], tuple[int, float]] = {}
    for f in sorted(findings, key=lambda f: (f.started_at, f.engine, f.kind)):
        key = (f.role, f.kind)
        start, end = unix_s(f.started_at), unix_s(f.end_or_start)
        prev = last.get(key)
        if prev is not None and start - prev[1] <= gap_s:
            i = prev[0]
            n = int(out[i].evidence.get("episode_incidents", 1)) + 1
            out[i] = replace(out[i], evidence={**out[i].evidence, "episode_incidents": n})
            last[key] = (i, max(prev[1], end))
        else:
            out.append(replace(f, evidence={**f.evidence, "episode_incidents": 1}))
            last[key] = (len(out) - 1, end)
    return out


def daily_counts(
    starts: Sequence[float], exposure: Sequence[tuple[float, float]], window: Window
) -> tuple[list[float], list[float]]:
    """Events and observed days per UTC day of ``window`` (for the overdispersion)."""
    lo, hi = utc_window(window)
    xs, ts = [], []
    for b in buckets_between(lo, hi, "day"):
        s = max(unix_s(b), unix_s(lo))
        e = min(unix_s(b + bucket_length("day")), unix_s(hi))
        xs.append(float(sum(1 for t in starts if s <= t < e)))
        ts.append(overlap_s(exposure, s, e) / 86400.0)
    return xs, ts


def failure_comparison(data: DetectionInput, level: float) -> RateComparison | None:
    """``errors.rate_ratio``: failed shares compared with the overdispersion of the per-day
    failure counts (bursts) when the loader gave them, else as rare Poisson events."""
    errors = data.outcomes or {}
    by_day = data.outcomes_by_day
    cand, inc = errors.get("candidate", {}), errors.get("incumbent", {})
    plain = compare_failure_shares(
        cand.get("failed", 0), cand.get("sent", 0), inc.get("failed", 0), inc.get("sent", 0), level
    )
    if plain is None or not by_day:
        return plain
    days = sorted(set(by_day.get("candidate", {})) | set(by_day.get("incumbent", {})))
    sides = []
    for role in ("candidate", "incumbent"):
        per = by_day.get(role, {})
        sides.append(
            (
                [float(per.get(d, (0, 0))[1]) for d in days],
                [float(per.get(d, (0, 0))[0]) for d in days],
            )
        )
    return compare_dispersed_rates(sides[0][0], sides[0][1], sides[1][0], sides[1][1], level)


@dataclass
class IncidentSection:
    """Incidents of one deployment over one window: what :func:`incident_section` returns."""

    deployment: str
    window: Window
    config: IncidentConfig
    findings: list[Finding]
    exposure_days: dict[str, float]
    comparisons: dict[str, RateComparison | None]
    errors: dict[str, dict[str, int]]
    error_comparison: RateComparison | None
    per_day: list[dict[str, Any]]
    per_week: list[dict[str, Any]]
    memory: dict[str, dict[str, Slope]]
    stored_new: int = 0
    truncated: bool = False
    memory_comparison: MemoryComparison | None = None
    """Growth compared between the engines, levels and peaks per version."""
    upgrades: list[dict[str, Any]] = field(default_factory=list)
    """Per version change: the role's incident episodes and failures before and after it."""
    process_starts: dict[str, list[float]] = field(default_factory=dict)
    """Per role, every process start seen (Unix seconds): the first start and each restart,
    for the latency's warm-up exclusion."""

    def count(self, role: str, kind: str) -> int:
        return sum(1 for f in self.findings if f.role == role and f.kind == kind)

    def measurements(self) -> list[Measurement]:
        out: list[Measurement] = []
        days = self.exposure_days
        for kind in KINDS:
            c = self.comparisons.get(kind)
            n_c, n_i = self.count("candidate", kind), self.count("incumbent", kind)
            e_c = c.x1 if c is not None else n_c
            e_i = c.x2 if c is not None else n_i
            dispersion = "" if c is None else c.dispersion_note()
            out.append(
                Measurement(
                    key=f"incidents.{kind}.rate_ratio",
                    value=None if c is None else c.ratio,
                    interval=None if c is None else c.interval,
                    n=e_c + e_i,
                    unit="ratio",
                    detail=(
                        f"candidate {e_c} episode(s) ({n_c} incidents) in"
                        f" {days.get('candidate', 0.0):.2f} observed days vs incumbent {e_i}"
                        f" ({n_i}) in {days.get('incumbent', 0.0):.2f}; incidents of a kind"
                        f" within {self.config.episode_gap_s / 60:g} min of the previous are one"
                        " episode; exact conditional binomial test"
                        + dispersion
                        + ("" if c is None else f", p = {c.p_value:.3g}")
                    ),
                    restate=None if c is None else c.interval_at,
                )
            )
            out.append(
                Measurement(
                    key=f"incidents.{kind}.candidate_count",
                    value=float(n_c),
                    interval=None,
                    n=n_c,
                    unit="count",
                    detail=f"{kind} incidents of the candidate in the window",
                )
            )
        out.append(self._leak_measurement())
        if self.memory_comparison is not None:
            out.append(self.memory_comparison.measurement())
        e = self.error_comparison
        cand, inc = self.errors.get("candidate", {}), self.errors.get("incumbent", {})
        out.append(
            Measurement(
                key="errors.rate_ratio",
                value=None if e is None else e.ratio,
                interval=None if e is None else e.interval,
                n=cand.get("sent", 0) + inc.get("sent", 0),
                unit="ratio",
                detail=(
                    f"failed exchanges: candidate {cand.get('failed', 0)}/{cand.get('sent', 0)},"
                    f" incumbent {inc.get('failed', 0)}/{inc.get('sent', 0)} (http errors,"
                    " timeouts, connection errors; a cancelled exchange is sent, not failed);"
                    " exact conditional binomial interval on rare events"
                    + ("" if e is None else e.dispersion_note("per-day failure counts (bursts)"))
                    + ("" if e is None else f", p = {e.p_value:.3g}")
                ),
                restate=None if e is None else e.interval_at,
            )
        )
        return out + self._candidate_rates()

    def _candidate_rates(self) -> list[Measurement]:
        """The candidate's own rates with exact intervals (a ``zero_budget`` is judged on
        them): ``incidents.<kind>.candidate_rate`` per observed day, ``errors.candidate_rate``
        per exchange sent."""
        level, days = self.config.level, self.exposure_days.get("candidate", 0.0)
        out = [
            rate_measurement(
                f"incidents.{kind}.candidate_rate",
                self.count("candidate", kind),
                days,
                level,
                "per day",
                f"{kind} incidents of the candidate per observed day, exact Poisson interval",
            )
            for kind in KINDS
        ]
        cand = self.errors.get("candidate", {})
        out.append(
            rate_measurement(
                "errors.candidate_rate",
                int(cand.get("failed", 0)),
                float(cand.get("sent", 0)),
                level,
                "per exchange",
                "failed exchanges of the candidate per exchange sent, exact Poisson interval",
            )
        )
        return out

    def _leak_measurement(self) -> Measurement:
        key = "incidents.leak.candidate_mb_per_hour"
        leaks = [f for f in self.findings if f.role == "candidate" and f.kind == "leak"]
        if leaks:
            top = max(leaks, key=lambda f: float(f.evidence["mb_per_hour"]))
            ev = top.evidence
            iv = ev["interval"]
            return Measurement(
                key=key,
                value=float(ev["mb_per_hour"]),
                interval=Interval(float(iv["low"]), float(iv["high"]), float(iv["level"])),
                n=len(leaks),
                unit="MB/hour",
                detail=(
                    f"steepest of {len(leaks)} sustained leak(s) ({ev['series']}), Theil-Sen"
                    " over its growth within one process's life, interval widened for"
                    " autocorrelated noise"
                ),
            )
        trends = self.memory.get("candidate", {})
        usable = {k: s for k, s in trends.items() if math.isfinite(s.mb_per_hour)}
        if not usable:
            return Measurement(key, None, None, 0, "MB/hour", "no candidate memory series")
        series, s = max(usable.items(), key=lambda kv: kv[1].mb_per_hour)
        return Measurement(
            key=key,
            value=s.mb_per_hour,
            interval=Interval(s.low, s.high, self.config.level),
            n=s.n,
            unit="MB/hour",
            detail=(
                f"no sustained leak; the candidate's overall {series} trend (Theil-Sen over its"
                " longest stretch between restarts, warm-up left out, interval widened for"
                " autocorrelated noise)"
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "deployment": self.deployment,
            "window": {"from": self.window[0].isoformat(), "to": self.window[1].isoformat()},
            "config": asdict(self.config),
            "exposure_days": self.exposure_days,
            "counts": {role: {k: self.count(role, k) for k in KINDS} for role in ROLES},
            "comparisons": {
                k: (None if c is None else c.to_dict()) for k, c in self.comparisons.items()
            },
            "errors": {
                **self.errors,
                "comparison": None
                if self.error_comparison is None
                else self.error_comparison.to_dict(),
            },
            "per_day": self.per_day,
            "per_week": self.per_week,
            "timeline": [
                {
                    "engine": f.engine,
                    "role": f.role,
                    "kind": f.kind,
                    "started_at": f.started_at.isoformat(),
                    "ended_at": f.ended_at.isoformat() if f.ended_at else None,
                }
                for f in self.findings
            ],
            "incidents": [f.to_dict() for f in self.findings],
            "memory": {
                role: {k: s.to_dict() for k, s in series.items()}
                for role, series in self.memory.items()
            },
            "stored_new": self.stored_new,
            "truncated": self.truncated,
            "upgrades": self.upgrades,
            "memory_comparison": None
            if self.memory_comparison is None
            else self.memory_comparison.to_dict(),
            "measurements": [m.to_dict() for m in self.measurements()],
        }


def incident_section(
    deployment: str,
    window: Window,
    data: DetectionInput,
    findings: Sequence[Finding],
    config: IncidentConfig = IncidentConfig(),
    *,
    stored_new: int = 0,
) -> IncidentSection:
    """Compare the engines' incident rates per observed day and their failure shares over
    ``window`` (measurement keys ``incidents.*`` and ``errors.rate_ratio``), from the detection
    input and what :func:`detect_incidents` found in it. ``stored_new``: how many of the
    findings :func:`evaluator.incidents.store.store_incidents` added (the section shows it)."""
    window = utc_window(window)
    findings = list(findings)
    if data.outcomes is None:
        raise ValueError(
            "the detection input has no exchange outcomes: load it with load_detection_input"
        )
    roles = data.roles()
    observed = data.observed_by_engine(config.health_max_gap_s)
    exposure = role_intervals(observed, roles, data.sent, config.health_max_gap_s)
    lo, hi = unix_s(window[0]), unix_s(window[1])
    days = {role: overlap_s(exposure[role], lo, hi) / 86400.0 for role in ROLES}
    comparisons: dict[str, RateComparison | None] = {}
    eps = episodes(findings, config.episode_gap_s)
    for kind in KINDS:
        if days["candidate"] > 0 and days["incumbent"] > 0:
            per_role = []
            for side in ("candidate", "incumbent"):
                starts = [unix_s(f.started_at) for f in eps if f.role == side and f.kind == kind]
                per_role.append(daily_counts(starts, exposure[side], window))
            (x1, t1), (x2, t2) = per_role
            comparisons[kind] = compare_dispersed_rates(x1, t1, x2, t2, config.level)
        else:
            comparisons[kind] = None
    errors = data.outcomes
    error_comparison = failure_comparison(data, config.level)
    memory_points = data.memory_by_engine()
    health = data.health_by_engine()
    restarts: dict[str, list[float]] = defaultdict(list)
    for f in findings:
        restarts[f.engine].extend(restart_times([f]))
    for eng, pts in health.items():
        restarts[eng] = process_starts(pts, [f for f in findings if f.engine == eng])
    memory: dict[str, dict[str, Slope]] = {}
    for eng, pts in memory_points.items():
        role = roles.get(eng)
        if role in ROLES:
            for series, s in memory_trends(pts, restarts[eng], config).items():
                best = memory.setdefault(role, {}).get(series)
                if best is None or s.mb_per_hour > best.mb_per_hour:
                    memory[role][series] = s
    memory_comparison = compare_memory(memory_points, health, roles, restarts, config.leak_params)
    return IncidentSection(
        deployment=deployment,
        window=window,
        config=config,
        findings=findings,
        exposure_days=days,
        comparisons=comparisons,
        errors=errors,
        error_comparison=error_comparison,
        per_day=bucket_table(findings, exposure, window, "day", level=config.level),
        per_week=bucket_table(findings, exposure, window, "week", level=config.level),
        memory=memory,
        stored_new=stored_new,
        truncated=data.truncated,
        memory_comparison=memory_comparison,
        upgrades=upgrade_table(findings, eps, exposure, window, data.outcomes_by_day, config.level),
        process_starts={
            role: sorted(t for eng, ts in restarts.items() if roles.get(eng) == role for t in ts)
            for role in ROLES
        },
    )
