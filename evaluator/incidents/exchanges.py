"""Incidents other than restarts: error bursts and hangs (from the exchanges, and from slow
``/health`` answers), memory leaks (:mod:`evaluator.incidents.leak` on the health samples'
memory series), and crashes seen only through connection errors.

- **crash** without health samples: a cluster of ``connection_error`` exchanges; with health
  samples, the ``connection_error`` exchanges around a restart are its evidence. Not those
  whose error says the mirror cut an answer past its cap (:data:`ANSWER_TRUNCATED`): the engine
  answered, too much; a failure, never a sign of a crash.
- **error_burst**: failed exchanges (``http_error``, answers the mirror cut, and
  ``connection_error`` no restart explains) whose count in a ``burst_window_s`` window is far
  above the engine's baseline share (exact binomial tail below ``burst_alpha``, at least
  ``burst_min_errors`` and ``burst_factor`` times the baseline).
- **hang**: ``timeout`` exchanges, streams that stalled (TTFT or one inter-token gap of at least
  ``hang_stall_s``), ``/health`` slower than ``hang_health_latency_s``.
- **leak**: ``gpu_mem_bytes`` and ``cpu_mem_bytes``, cut at every process start.

Events of one kind on one engine closer than ``cluster_gap_s`` are one incident
(:func:`merge_findings`).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from scipy import stats

from evaluator.incidents.leak import find_leaks
from evaluator.incidents.model import (
    MEMORY_SERIES,
    ExchangeEvent,
    Finding,
    HealthPoint,
    IncidentConfig,
    SentCounts,
    unix_s,
    utc_at,
)
from shadow_ab.records import ANSWER_TRUNCATED


def merge_findings(
    findings: Sequence[Finding], gap_s: float, prefer: Callable[[Finding], float] | None = None
) -> list[Finding]:
    """Findings of the same engine and kind that overlap (or are ``gap_s`` apart) as one."""
    out: list[Finding] = []
    for f in sorted(findings, key=lambda f: (f.engine, f.kind, f.started_at)):
        last = out[-1] if out else None
        if (
            last is not None
            and last.engine == f.engine
            and last.kind == f.kind
            and (last.ended_at is None or unix_s(f.started_at) - unix_s(last.ended_at) <= gap_s)
        ):
            ended = (
                None
                if last.ended_at is None or f.ended_at is None
                else max(last.ended_at, f.ended_at)
            )
            main, other = (last, f)
            if prefer is not None and prefer(f) > prefer(last):
                main, other = f, last
            evidence = dict(main.evidence)
            evidence["merged"] = [*evidence.get("merged", []), other.evidence]
            out[-1] = replace(main, started_at=last.started_at, ended_at=ended, evidence=evidence)
        else:
            out.append(f)
    return out


def _cluster(times: Sequence[float], gap_s: float) -> list[tuple[int, int]]:
    """Index ranges ``[i, j)`` of sorted ``times`` with gaps of at most ``gap_s`` inside."""
    out: list[tuple[int, int]] = []
    i = 0
    for k in range(1, len(times) + 1):
        if k == len(times) or times[k] - times[k - 1] > gap_s:
            out.append((i, k))
            i = k
    return out if times else []


def _inside(t: float, spans: Sequence[tuple[float, float]], margin: float) -> bool:
    return any(a - margin <= t <= b + margin for a, b in spans)


def _spans(
    findings: Iterable[Finding], kinds: set[str], horizon: float
) -> list[tuple[float, float]]:
    return [
        (unix_s(f.started_at), unix_s(f.ended_at) if f.ended_at else horizon)
        for f in findings
        if f.kind in kinds
    ]


def detect_exchange_incidents(
    events: Sequence[ExchangeEvent],
    sent: SentCounts,
    health_findings: Sequence[Finding],
    role_of: Mapping[str, str],
    observed: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    config: IncidentConfig = IncidentConfig(),
) -> tuple[list[Finding], dict[str, Any]]:
    """Crashes without health data, error bursts and hangs from exchanges, for every engine.

    ``events``: the exchanges that failed, timed out or stalled; ``sent``: how many were sent;
    ``health_findings``: what the health samples showed (connection errors during a crash
    become its evidence); ``observed``: per engine, when health samples were watching it.
    Returns the new findings and, per engine, the connection errors each crash explained
    (``{"crash_connection_errors": {engine: {crash started_at: count}}}``)."""
    observed = observed or {}
    horizon = max((unix_s(e.sent_at) for e in events), default=0.0) + 1.0
    out: list[Finding] = []
    attached: dict[str, dict[str, int]] = defaultdict(dict)
    by_engine: dict[str, list[ExchangeEvent]] = defaultdict(list)
    for e in events:
        by_engine[e.engine].append(e)
    for eng, evs in sorted(by_engine.items()):
        evs.sort(key=lambda e: e.sent_at)
        role = role_of.get(eng, evs[0].role)
        mine = [f for f in health_findings if f.engine == eng]
        crashes = [
            f for f in mine if f.kind in ("crash", "version_change") and f.evidence.get("restart")
        ]
        crash_spans = _spans(crashes, {"crash", "version_change"}, horizon)
        failures: list[ExchangeEvent] = []
        unexplained_conn: list[ExchangeEvent] = []
        hang_events: list[ExchangeEvent] = []
        for e in evs:
            t = unix_s(e.sent_at)
            in_crash = _inside(t, crash_spans, config.crash_margin_s)
            cut = e.status == "connection_error" and (e.error or "").startswith(ANSWER_TRUNCATED)
            if e.status == "connection_error" and not cut:
                if in_crash:
                    for c in crashes:
                        a = unix_s(c.started_at) - config.crash_margin_s
                        b = (unix_s(c.ended_at) if c.ended_at else horizon) + config.crash_margin_s
                        if a <= t <= b:
                            key = c.started_at.isoformat()
                            attached[eng][key] = attached[eng].get(key, 0) + 1
                            break
                elif _inside(t, observed.get(eng, ()), config.health_max_gap_s):
                    failures.append(e)  # health saw no restart: a failure like any other
                else:
                    unexplained_conn.append(e)
            elif in_crash:
                continue
            elif e.status == "http_error" or cut:  # cut: an answer past the mirror's cap
                failures.append(e)
            elif e.status == "timeout" or e.stalled(config.hang_stall_s):
                hang_events.append(e)
        # Crashes seen only through connection errors (no health samples then).
        times = [unix_s(e.sent_at) for e in unexplained_conn]
        for i, j in _cluster(times, config.cluster_gap_s):
            group = unexplained_conn[i:j]
            if len(group) >= config.crash_min_connection_errors:
                out.append(
                    Finding(
                        eng,
                        role,
                        "crash",
                        group[0].sent_at,
                        group[-1].sent_at,
                        {
                            "source": "exchanges",
                            "connection_errors": len(group),
                            "errors": sorted({e.error or "" for e in group})[:5],
                            "restart": False,
                        },
                    )
                )
            else:
                failures.extend(group)
        failures.sort(key=lambda e: e.sent_at)
        out.extend(_error_bursts(eng, role, failures, sent, config))
        out.extend(_hangs(eng, role, hang_events, config))
    return out, {"crash_connection_errors": {k: dict(v) for k, v in attached.items()}}


def _error_bursts(
    eng: str, role: str, failures: Sequence[ExchangeEvent], sent: SentCounts, config: IncidentConfig
) -> list[Finding]:
    key = sent.key(eng, role)
    total = sent.total(key)
    if not failures or total <= 0:
        return []
    baseline = len(failures) / total
    p0 = max(baseline, config.burst_floor_share)
    times = [unix_s(e.sent_at) for e in failures]
    w = config.burst_window_s
    flagged: list[tuple[int, int, int, float, float]] = []
    for i, t in enumerate(times):
        j = bisect.bisect_left(times, t + w)
        k = j - i
        if k < config.burst_min_errors:
            continue
        n = max(float(k), sent.count(key, t, t + w))
        share = k / n
        if share < config.burst_min_share or share < config.burst_factor * baseline:
            continue
        p = float(stats.binom.sf(k - 1, max(round(n), k), p0))
        if p < config.burst_alpha:
            flagged.append((i, j, k, n, p))
    out: list[Finding] = []
    groups: list[list[tuple[int, int, int, float, float]]] = []
    for item in flagged:
        if groups and times[item[0]] - times[groups[-1][-1][1] - 1] <= config.cluster_gap_s:
            groups[-1].append(item)
        else:
            groups.append([item])
    for g in groups:
        i, j = g[0][0], max(x[1] for x in g)
        group = failures[i:j]
        best = max(g, key=lambda x: x[2] / x[3])
        span_n = max(float(len(group)), sent.count(key, times[i], times[j - 1] + 1e-3))
        out.append(
            Finding(
                eng,
                role,
                "error_burst",
                group[0].sent_at,
                group[-1].sent_at,
                {
                    "source": "exchanges",
                    "failed": len(group),
                    "sent": round(span_n),
                    "peak_window_s": config.burst_window_s,
                    "peak_failed": best[2],
                    "peak_sent": round(best[3]),
                    "peak_share": best[2] / best[3],
                    "baseline_share": baseline,
                    "p_value": min(x[4] for x in g),
                    "statuses": dict(Counter(str(e.http_status or e.status) for e in group)),
                    "errors": sorted({(e.error or "")[:200] for e in group})[:5],
                },
            )
        )
    return out


def _hangs(
    eng: str, role: str, events: Sequence[ExchangeEvent], config: IncidentConfig
) -> list[Finding]:
    if not events:
        return []
    evs = sorted(events, key=lambda e: e.sent_at)
    ends = [unix_s(e.sent_at) + (e.e2e_s or e.ttft_s or 0.0) for e in evs]
    times = [unix_s(e.sent_at) for e in evs]
    out: list[Finding] = []
    i = 0
    while i < len(evs):  # cluster on overlapping [sent, end] spans, gap_s apart at most
        j, reach = i + 1, ends[i]
        while j < len(evs) and times[j] - reach <= config.cluster_gap_s:
            reach = max(reach, ends[j])
            j += 1
        group = evs[i:j]
        if len(group) >= config.hang_min_events:
            out.append(
                Finding(
                    eng,
                    role,
                    "hang",
                    group[0].sent_at,
                    utc_at(reach),
                    {
                        "source": "exchanges",
                        "timeouts": sum(e.status == "timeout" for e in group),
                        "stalled": sum(
                            e.status != "timeout" and e.stalled(config.hang_stall_s) for e in group
                        ),
                        "max_itl_s": max((e.max_itl_s or 0.0) for e in group),
                        "max_ttft_s": max((e.ttft_s or 0.0) for e in group),
                        "stall_threshold_s": config.hang_stall_s,
                    },
                )
            )
        i = j
    return out


def detect_health_hangs(
    points: Sequence[HealthPoint], config: IncidentConfig = IncidentConfig()
) -> list[Finding]:
    """ONE engine's ``/health`` answering slower than ``hang_health_latency_s`` (while up)."""
    slow = sorted(
        (p for p in points if p.up and (p.latency_s or 0.0) >= config.hang_health_latency_s),
        key=lambda p: p.ts,
    )
    times = [unix_s(p.ts) for p in slow]
    out = []
    for i, j in _cluster(times, config.cluster_gap_s):
        group = slow[i:j]
        if len(group) >= config.hang_min_events:
            out.append(
                Finding(
                    group[0].engine,
                    group[0].role,
                    "hang",
                    group[0].ts,
                    group[-1].ts,
                    {
                        "source": "health",
                        "slow_samples": len(group),
                        "max_latency_s": max(p.latency_s or 0.0 for p in group),
                        "latency_threshold_s": config.hang_health_latency_s,
                    },
                )
            )
    return out


def detect_leaks(
    points: Sequence[HealthPoint],
    starts: Sequence[float],
    config: IncidentConfig = IncidentConfig(),
) -> list[Finding]:
    """Leaks in ONE engine's memory series (``gpu_mem_bytes`` and ``cpu_mem_bytes``), cut at
    its process ``starts`` (Unix seconds: restarts, and the first start when known); leaks of
    both series over overlapping times are one finding (the steeper one's rate on top)."""
    if not points:
        return []
    engine, role = points[0].engine, points[0].role
    params = config.leak_params
    found: list[Finding] = []
    for series in MEMORY_SERIES:
        pairs = [
            (unix_s(p.ts), getattr(p, series)) for p in points if getattr(p, series) is not None
        ]
        if not pairs:
            continue
        t, y = zip(*pairs, strict=True)
        for leak in find_leaks(t, y, starts, params):
            found.append(
                Finding(
                    engine,
                    role,
                    "leak",
                    utc_at(leak.start),
                    None if leak.ongoing else utc_at(leak.end),
                    {
                        "series": series,
                        "mb_per_hour": leak.rate.mb_per_hour,
                        "interval": {
                            "low": leak.rate.low,
                            "high": leak.rate.high,
                            "level": params.level,
                        },
                        "threshold_mb_per_hour": params.threshold_mb_h,
                        "sustain_h": params.sustain_s / 3600.0,
                        "rho": leak.rate.rho,
                        "stretches": leak.stretches,
                        "steepest_stretch_mb_per_hour": leak.steepest_mb_h,
                        "runs": [r.to_dict() for r in leak.runs],
                        "last_window_end": utc_at(leak.end).isoformat(),
                        "ongoing": leak.ongoing,
                        "method": (
                            "Theil-Sen slope over the growth within one process's life (warm-up"
                            " and refill left out), interval widened for autocorrelated noise"
                        ),
                    },
                )
            )
    return merge_findings(found, gap_s=0.0, prefer=lambda f: float(f.evidence["mb_per_hour"]))
