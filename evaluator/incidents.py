"""Incidents: crashes, version changes, leaks, error bursts and hangs found in the store's data.

Detection is pure functions over plain sequences (:class:`HealthPoint`, :class:`ExchangeEvent`,
:class:`SentCounts`), wrapped by thin loaders that read the store:

- **crash** (restart): per engine, a new ``process_start_time``; or, where the engine does not
  report one, ``/health`` down then up with the down samples refusing connections (a live
  server answering 503 is not a crash). ``connection_error`` exchanges around it are its
  evidence; without health samples, a cluster of ``connection_error`` exchanges is a crash.
  The engine's first start (never seen up before) is not an incident.
- **version_change**: ``/version`` differs from the previous sample's. A restart that brings a
  new version is one version_change (``evidence.restart`` true), not also a crash.
- **leak**: :mod:`evaluator.leak` on ``gpu_mem_bytes`` and ``cpu_mem_bytes``, cut at restarts.
- **error_burst**: failed exchanges (``http_error``, and ``connection_error`` no restart explains)
  whose count in a ``burst_window_s`` window is far above the engine's baseline share (exact
  binomial tail below ``burst_alpha``, at least ``burst_min_errors`` and ``burst_factor`` times
  the baseline); ``/health`` answering 503 for a while without a restart too.
- **hang**: ``timeout`` exchanges, streams that stalled (TTFT or one inter-token gap of at least
  ``hang_stall_s``), ``/health`` slower than ``hang_health_latency_s`` or timing out.

Events of one kind on one engine closer than ``cluster_gap_s`` are one incident; error bursts and
hangs inside a crash (± ``crash_margin_s``) belong to the crash. Each :class:`Finding` carries
its evidence (counts, samples, statistics) as a JSON-able dict.

:func:`store_incidents` writes findings idempotently: a finding that overlaps a stored incident
of the same deployment, engine and kind updates that row (so re-running detection over another
window, or after more data arrived, never duplicates an incident).

Errors: store failures surface as :class:`storage.errors.StorageError` (translated at the query
boundary).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats
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
from sqlalchemy.dialects import postgresql, sqlite

from evaluator.leak import LeakParams, Slope, find_leaks, trend
from evaluator.rates import (
    By,
    RateComparison,
    as_utc,
    bucket_label,
    bucket_length,
    buckets_between,
    compare_failure_shares,
    compare_poisson_rates,
    observed_intervals,
    overlap_s,
)
from evaluator.results import Interval, Measurement
from storage.errors import translate
from storage.models import Base

if TYPE_CHECKING:
    from evaluator.latency import WarmupWindow

Window = tuple[datetime, datetime]
Progress = Callable[[str, float], None]
KINDS: tuple[str, ...] = ("crash", "version_change", "leak", "error_burst", "hang")
ROLES: tuple[str, ...] = ("incumbent", "candidate")
MEMORY_SERIES: tuple[str, ...] = ("gpu_mem_bytes", "cpu_mem_bytes")
FAILED_STATUSES: tuple[str, ...] = ("http_error", "timeout", "connection_error")
"""Exchange statuses that count as failures (``cancelled`` is the mirror's doing: neither)."""

EXCHANGES = Base.metadata.tables["exchanges"]
HEALTH = Base.metadata.tables["health_samples"]
INCIDENTS = Base.metadata.tables["incidents"]
DEPLOYMENTS = Base.metadata.tables["deployments"]


@dataclass(frozen=True)
class IncidentConfig:
    """Thresholds of incident detection (the defaults suit scrapes every 5-30 s)."""

    cluster_gap_s: float = 60.0
    """Events of one kind on one engine closer than this are one incident."""
    crash_margin_s: float = 30.0
    """Exchange failures this close to a crash are part of it."""
    crash_min_connection_errors: int = 3
    """Without health samples, this many connection errors in a cluster make a crash."""
    health_min_down_samples: int = 2
    """A health outage without a restart (503s or probe timeouts from a live process) needs
    this many consecutive down samples (one slow probe on a busy host is not an incident)."""
    health_max_gap_s: float = 120.0
    """Scrapes further apart than this leave a hole in the observed time (exposure)."""
    leak_window_h: float = 2.0
    leak_step_min: float = 15.0
    leak_threshold_mb_h: float = 20.0
    """A window counts when the lower bound of its slope is above this (MB/hour)."""
    leak_sustain_h: float = 3.0
    """...and a leak is reported when such windows span at least this long."""
    leak_bin_s: float = 120.0
    leak_min_points: int = 10
    burst_window_s: float = 60.0
    burst_min_errors: int = 5
    burst_min_share: float = 0.2
    burst_factor: float = 5.0
    burst_alpha: float = 1e-6
    burst_floor_share: float = 1e-3
    """Baseline share used when the engine's own is lower (a clean engine is not perfect)."""
    hang_stall_s: float = 10.0
    hang_health_latency_s: float = 5.0
    hang_min_events: int = 1
    level: float = 0.95

    def for_time_scale(self, scale: float) -> IncidentConfig:
        """The same detection for a simulator running ``scale`` simulated seconds per real
        second (health samples carry real time): durations on the fault timeline (leak
        windows, steps, sustain, bins, clustering, crash margin, burst window, observed-time
        gaps) divided by ``scale``, the leak threshold (MB per real hour) multiplied by it.
        Latency thresholds (``hang_stall_s``, ``hang_health_latency_s``) stay: they are what
        a client measures. Reported leak rates are then per real hour: divide by ``scale``."""
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        return replace(
            self,
            cluster_gap_s=self.cluster_gap_s / scale,
            crash_margin_s=self.crash_margin_s / scale,
            health_max_gap_s=self.health_max_gap_s / scale,
            leak_window_h=self.leak_window_h / scale,
            leak_step_min=self.leak_step_min / scale,
            leak_threshold_mb_h=self.leak_threshold_mb_h * scale,
            leak_sustain_h=self.leak_sustain_h / scale,
            leak_bin_s=self.leak_bin_s / scale,
            burst_window_s=self.burst_window_s / scale,
        )

    @property
    def leak_params(self) -> LeakParams:
        return LeakParams(
            window_s=self.leak_window_h * 3600.0,
            step_s=self.leak_step_min * 60.0,
            threshold_mb_h=self.leak_threshold_mb_h,
            sustain_s=self.leak_sustain_h * 3600.0,
            bin_s=self.leak_bin_s,
            min_points=self.leak_min_points,
            level=self.level,
        )


@dataclass(frozen=True)
class Finding:
    """One incident on one engine."""

    engine: str
    role: str
    kind: str
    started_at: datetime
    ended_at: datetime | None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "role": self.role,
            "kind": self.kind,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "evidence": self.evidence,
        }

    @property
    def end_or_start(self) -> datetime:
        return self.ended_at or self.started_at


@dataclass(frozen=True)
class HealthPoint:
    """The health-sample columns detection reads."""

    engine: str
    role: str
    ts: datetime
    up: bool
    http_status: int | None = None
    latency_s: float | None = None
    error: str | None = None
    version: str | None = None
    process_start_time: float | None = None
    gpu_mem_bytes: int | None = None
    cpu_mem_bytes: int | None = None
    iteration: float | None = None
    """TensorRT-LLM's iteration counter (``metrics["iter"]``): going back means a new process
    (TensorRT-LLM reports no process start time)."""

    @classmethod
    def from_sample(cls, s: Any) -> HealthPoint:
        """From a :class:`shadow_ab.records.HealthSample` (or anything with its fields)."""
        return cls(
            engine=s.engine,
            role=str(s.role),
            ts=as_utc(s.ts),
            up=s.up,
            http_status=s.http_status,
            latency_s=s.latency_s,
            error=s.error,
            version=s.version,
            process_start_time=s.process_start_time,
            gpu_mem_bytes=s.gpu_mem_bytes,
            cpu_mem_bytes=s.cpu_mem_bytes,
            iteration=(s.metrics or {}).get("iter"),
        )


@dataclass(frozen=True)
class ExchangeEvent:
    """An exchange worth a look: failed, timed out or stalled."""

    engine: str
    role: str
    sent_at: datetime
    status: str
    http_status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    max_itl_s: float | None = None

    @classmethod
    def from_record(cls, r: Any) -> ExchangeEvent:
        """From a :class:`shadow_ab.records.ExchangeRecord`."""
        return cls(
            engine=r.engine,
            role=str(r.role),
            sent_at=as_utc(r.sent_at),
            status=str(r.status),
            http_status=r.http_status,
            error=r.error,
            ttft_s=r.ttft_s,
            e2e_s=r.e2e_s,
            max_itl_s=max(r.itl_s) if r.itl_s else None,
        )

    def stalled(self, stall_s: float) -> bool:
        return (self.ttft_s is not None and self.ttft_s >= stall_s) or (
            self.max_itl_s is not None and self.max_itl_s >= stall_s
        )


@dataclass
class SentCounts:
    """Exchanges sent per key in fixed bins: counts of any span without loading every row.

    Keys are engine ids (built from plain values) or, as the store's loader builds it, roles
    (``by_role``: the replay role counts with the incumbent, whose engine serves it); the loader
    counts bins only around failures and gives each key's whole-window ``totals`` and
    first/last exchange (``extent``) separately."""

    bin_s: float = 60.0
    bins: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """key -> (sorted bin indices, cumulative counts)."""
    by_role: bool = False
    totals: dict[str, int] = field(default_factory=dict)
    """Whole-window totals per key, when the bins do not cover the whole window."""
    extent: dict[str, tuple[float, float]] = field(default_factory=dict)
    """First and last exchange per key (Unix seconds), when the bins do not cover everything."""

    def key(self, engine: str, role: str) -> str:
        if not self.by_role:
            return engine
        return "incumbent" if role == "replay" else role

    @classmethod
    def from_times(cls, by_engine: Mapping[str, Iterable[datetime]], bin_s: float = 60.0) -> Any:
        counted: dict[str, Counter[int]] = {}
        for eng, times in by_engine.items():
            counted[eng] = Counter(int(as_utc(t).timestamp() // bin_s) for t in times)
        return cls.from_bins(counted, bin_s)

    @classmethod
    def from_bins(cls, counted: Mapping[str, Mapping[int, int]], bin_s: float) -> SentCounts:
        out = cls(bin_s)
        for eng, c in counted.items():
            keys = np.array(sorted(c), dtype=np.int64)
            cum = np.cumsum([c[int(k)] for k in keys]).astype(np.int64)
            out.bins[eng] = (keys, cum)
        return out

    def total(self, engine: str) -> int:
        if engine in self.totals:
            return self.totals[engine]
        entry = self.bins.get(engine)
        return int(entry[1][-1]) if entry is not None and len(entry[1]) else 0

    def count(self, engine: str, start: float, end: float) -> float:
        """Exchanges sent in ``[start, end)`` (Unix seconds); partial bins count in proportion."""
        entry = self.bins.get(engine)
        if entry is None or not len(entry[0]) or end <= start:
            return 0.0
        keys, cum = entry
        lo_bin, hi_bin = math.floor(start / self.bin_s), math.floor(end / self.bin_s)

        def upto(b: int) -> int:  # exchanges in bins < b
            i = int(np.searchsorted(keys, b, side="left"))
            return int(cum[i - 1]) if i else 0

        def in_bin(b: int) -> int:
            return upto(b + 1) - upto(b)

        if lo_bin == hi_bin:
            return in_bin(lo_bin) * (end - start) / self.bin_s
        whole = upto(hi_bin) - upto(lo_bin + 1)
        head = in_bin(lo_bin) * ((lo_bin + 1) * self.bin_s - start) / self.bin_s
        tail = in_bin(hi_bin) * (end - hi_bin * self.bin_s) / self.bin_s
        return whole + head + tail

    def times(self, engine: str) -> list[float]:
        """The start of every bin with traffic (for the observed time without health data)."""
        entry = self.bins.get(engine)
        return [] if entry is None else [float(k) * self.bin_s for k in entry[0]]

    def spans(self, key: str, max_gap_s: float) -> list[tuple[float, float]]:
        """When ``key`` received exchanges: its ``extent`` if known, else its bins joined
        across gaps up to ``max_gap_s``."""
        if key in self.extent:
            return [self.extent[key]]
        return [(a, b + self.bin_s) for a, b in observed_intervals(self.times(key), max_gap_s)]


# -- pure detection -------------------------------------------------------------------------


def _ts(d: datetime) -> float:
    return as_utc(d).timestamp()


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _is_connection_failure(p: HealthPoint) -> bool:
    return p.http_status is None and not _is_timeout(p.error)


def _is_timeout(error: str | None) -> bool:
    return error is not None and "timeout" in error.lower().replace(" ", "")


def detect_restarts(
    points: Sequence[HealthPoint], config: IncidentConfig = IncidentConfig()
) -> list[Finding]:
    """Crashes, version changes and health outages without a restart, for ONE engine's health
    samples (any order)."""
    pts = sorted(points, key=lambda p: p.ts)
    out: list[Finding] = []
    prev_pst: float | None = None
    prev_iter: float | None = None
    prev_version: str | None = None
    last_up: HealthPoint | None = None
    down: list[HealthPoint] = []
    for p in pts:
        if not p.up:
            down.append(p)
            continue
        new_pst = (
            p.process_start_time is not None
            and prev_pst is not None
            and abs(p.process_start_time - prev_pst) > 1.0
        )
        iter_back = p.iteration is not None and prev_iter is not None and p.iteration < prev_iter
        restarted = new_pst or iter_back
        same_process = (
            p.process_start_time is not None
            and prev_pst is not None
            and abs(p.process_start_time - prev_pst) <= 1.0
        )
        refused = any(_is_connection_failure(d) for d in down)
        if last_up is not None and (restarted or (down and refused and not same_process)):
            changed = bool(p.version and prev_version and p.version != prev_version)
            start = down[0].ts if down else last_up.ts
            evidence: dict[str, Any] = {
                "source": "health",
                "last_up_at": last_up.ts.isoformat(),
                "first_down_at": down[0].ts.isoformat() if down else None,
                "back_up_at": p.ts.isoformat(),
                "down_samples": len(down),
                "down_errors": sorted({d.error or f"HTTP {d.http_status}" for d in down})[:5],
                "old_process_start_time": prev_pst,
                "new_process_start_time": p.process_start_time,
                "signals": [
                    name
                    for name, on in (
                        ("new process start time", new_pst),
                        ("iteration counter went back", iter_back),
                        ("health refused connections, then answered", bool(down) and refused),
                    )
                    if on
                ],
                "restart": True,
            }
            if changed:
                evidence.update(from_version=prev_version, to_version=p.version)
                out.append(Finding(p.engine, p.role, "version_change", start, p.ts, evidence))
            else:
                out.append(Finding(p.engine, p.role, "crash", start, p.ts, evidence))
        elif len(down) >= config.health_min_down_samples and last_up is not None:
            timeouts = sum(_is_timeout(d.error) for d in down)
            kind = "hang" if timeouts * 2 >= len(down) else "error_burst"
            out.append(
                Finding(
                    p.engine,
                    p.role,
                    kind,
                    down[0].ts,
                    p.ts,
                    {
                        "source": "health",
                        "down_samples": len(down),
                        "http_statuses": sorted({d.http_status or 0 for d in down}),
                        "down_errors": sorted({d.error or "" for d in down})[:5],
                        "same_process": same_process,
                    },
                )
            )
        elif p.version and prev_version and p.version != prev_version:
            out.append(
                Finding(
                    p.engine,
                    p.role,
                    "version_change",
                    p.ts,
                    p.ts,
                    {
                        "source": "health",
                        "from_version": prev_version,
                        "to_version": p.version,
                        "restart": False,
                    },
                )
            )
        if p.process_start_time is not None:
            prev_pst = p.process_start_time
        if p.iteration is not None:
            prev_iter = p.iteration
        if p.version:
            prev_version = p.version
        last_up = p
        down = []
    if down and last_up is not None and len(down) >= 2:
        refused = any(_is_connection_failure(d) for d in down)
        out.append(
            Finding(
                down[0].engine,
                down[0].role,
                "crash" if refused else "error_burst",
                down[0].ts,
                None,
                {
                    "source": "health",
                    "last_up_at": last_up.ts.isoformat(),
                    "first_down_at": down[0].ts.isoformat(),
                    "down_samples": len(down),
                    "still_down_at": down[-1].ts.isoformat(),
                    "down_errors": sorted({d.error or f"HTTP {d.http_status}" for d in down})[:5],
                },
            )
        )
    return out


def restart_times(findings: Iterable[Finding]) -> list[float]:
    """Unix seconds of every restart among ``findings`` (where memory resets)."""
    out = []
    for f in findings:
        if f.evidence.get("restart") and f.ended_at is not None:
            pst = f.evidence.get("new_process_start_time")
            out.append(float(pst) if pst is not None else _ts(f.ended_at))
    return sorted(out)


def detect_leaks(
    points: Sequence[HealthPoint],
    restarts: Sequence[float],
    config: IncidentConfig = IncidentConfig(),
) -> list[Finding]:
    """Leaks in ONE engine's memory series (``gpu_mem_bytes`` and ``cpu_mem_bytes``); leaks of
    both series over overlapping times are one finding (the steeper one's rate on top)."""
    if not points:
        return []
    engine, role = points[0].engine, points[0].role
    params = config.leak_params
    found: list[Finding] = []
    for series in MEMORY_SERIES:
        pairs = [(_ts(p.ts), getattr(p, series)) for p in points if getattr(p, series) is not None]
        if not pairs:
            continue
        t, y = zip(*pairs, strict=True)
        for leak in find_leaks(t, y, restarts, params):
            found.append(
                Finding(
                    engine,
                    role,
                    "leak",
                    _dt(leak.start),
                    None if leak.ongoing else _dt(leak.end),
                    {
                        "series": series,
                        "mb_per_hour": leak.rate.mb_per_hour,
                        "interval": {
                            "low": leak.rate.low,
                            "high": leak.rate.high,
                            "level": params.level,
                        },
                        "threshold_mb_per_hour": params.threshold_mb_h,
                        "windows": leak.windows,
                        "max_window_mb_per_hour": leak.max_window_mb_h,
                        "runs": [r.to_dict() for r in leak.runs],
                        "last_window_end": _dt(leak.end).isoformat(),
                        "ongoing": leak.ongoing,
                        "method": "Theil-Sen slope over sliding windows, restarts excluded",
                    },
                )
            )
    return _merge(found, gap_s=0.0, prefer=lambda f: float(f.evidence["mb_per_hour"]))


def memory_trends(
    points: Sequence[HealthPoint],
    restarts: Sequence[float],
    config: IncidentConfig = IncidentConfig(),
) -> dict[str, Slope]:
    """Each memory series' overall slope (longest piece between restarts), for the report."""
    out: dict[str, Slope] = {}
    for series in MEMORY_SERIES:
        pairs = [(_ts(p.ts), getattr(p, series)) for p in points if getattr(p, series) is not None]
        if pairs:
            t, y = zip(*pairs, strict=True)
            s = trend(t, y, restarts, config.leak_params)
            if s is not None:
                out[series] = s
    return out


def _merge(
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
            and (last.ended_at is None or _ts(f.started_at) - _ts(last.ended_at) <= gap_s)
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
        (_ts(f.started_at), _ts(f.ended_at) if f.ended_at else horizon)
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
    horizon = max((_ts(e.sent_at) for e in events), default=0.0) + 1.0
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
            t = _ts(e.sent_at)
            in_crash = _inside(t, crash_spans, config.crash_margin_s)
            if e.status == "connection_error":
                if in_crash:
                    for c in crashes:
                        a = _ts(c.started_at) - config.crash_margin_s
                        b = (_ts(c.ended_at) if c.ended_at else horizon) + config.crash_margin_s
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
            elif e.status == "http_error":
                failures.append(e)
            elif e.status == "timeout" or e.stalled(config.hang_stall_s):
                hang_events.append(e)
        # Crashes seen only through connection errors (no health samples then).
        times = [_ts(e.sent_at) for e in unexplained_conn]
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
    times = [_ts(e.sent_at) for e in failures]
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
    ends = [_ts(e.sent_at) + (e.e2e_s or e.ttft_s or 0.0) for e in evs]
    times = [_ts(e.sent_at) for e in evs]
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
                    _dt(reach),
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
    times = [_ts(p.ts) for p in slow]
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


@dataclass
class DetectionInput:
    """Everything detection reads, as plain values (built by :func:`load_detection_input`, or
    by hand in tests)."""

    health: list[HealthPoint]
    """Health samples: every one, or (from the store) only those where something changed."""
    events: list[ExchangeEvent] = field(default_factory=list)
    """Exchanges that failed, timed out or stalled."""
    sent: SentCounts = field(default_factory=SentCounts)
    memory: list[HealthPoint] | None = None
    """Memory series for leaks (binned, from the store); None = use ``health``."""
    observed: dict[str, list[tuple[float, float]]] | None = None
    """Per engine, when health samples watched it; None = from ``health``."""
    role_of: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    """True when the store held more notable exchanges than the loader's cap."""
    outcomes: dict[str, dict[str, int]] | None = None
    """Per role (incumbent, candidate): exchanges ``sent`` (all, read from the index) and
    ``failed`` (http_error, timeout, connection_error), for ``errors.rate_ratio``; None when
    not loaded."""

    def roles(self) -> dict[str, str]:
        roles = dict(self.role_of)
        for p in self.health:
            roles.setdefault(p.engine, p.role)
        for e in self.events:
            if e.role in ROLES:
                roles.setdefault(e.engine, e.role)
        return roles

    def health_by_engine(self) -> dict[str, list[HealthPoint]]:
        out: dict[str, list[HealthPoint]] = defaultdict(list)
        for p in self.health:
            out[p.engine].append(p)
        for pts in out.values():
            pts.sort(key=lambda p: p.ts)
        return out

    def memory_by_engine(self) -> dict[str, list[HealthPoint]]:
        if self.memory is None:
            return self.health_by_engine()
        out: dict[str, list[HealthPoint]] = defaultdict(list)
        for p in self.memory:
            out[p.engine].append(p)
        return out

    def observed_by_engine(self, max_gap_s: float) -> dict[str, list[tuple[float, float]]]:
        if self.observed is not None:
            return self.observed
        return {
            eng: observed_intervals((_ts(p.ts) for p in pts), max_gap_s)
            for eng, pts in self.health_by_engine().items()
        }


def detect_all(data: DetectionInput, config: IncidentConfig = IncidentConfig()) -> list[Finding]:
    """Every incident in plain data (the pure core of :func:`detect_incidents`)."""
    roles = data.roles()
    memory = data.memory_by_engine()
    observed = data.observed_by_engine(config.health_max_gap_s)
    health_findings: list[Finding] = []
    for eng, pts in data.health_by_engine().items():
        found = detect_restarts(pts, config)
        health_findings.extend(found)
        health_findings.extend(detect_leaks(memory.get(eng, []), restart_times(found), config))
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
    merged = _merge(
        [f for f in findings if f.kind in ("error_burst", "hang")], config.cluster_gap_s
    )
    horizon = max((_ts(f.end_or_start) for f in findings), default=0.0) + 1.0
    crash_spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in findings:
        if f.kind == "crash" or (f.kind == "version_change" and f.evidence.get("restart")):
            crash_spans[f.engine].append(
                (_ts(f.started_at), _ts(f.ended_at) if f.ended_at else horizon)
            )
    kept = [
        f
        for f in merged
        if not any(
            a - config.crash_margin_s <= _ts(f.started_at)
            and _ts(f.end_or_start) <= b + config.crash_margin_s
            for a, b in crash_spans[f.engine]
        )
    ]
    rest = [f for f in findings if f.kind not in ("error_burst", "hang")]
    return sorted([*rest, *kept], key=lambda f: (f.started_at, f.engine, f.kind))


def warmup_windows(findings: Iterable[Finding], warmup_s: float) -> list[WarmupWindow]:
    """The ``warmup_s`` after every restart (crash or restarting version change), per role,
    for :func:`evaluator.latency.analyze_latency` to leave out."""
    from evaluator.latency import WarmupWindow  # B1's class; imported when used

    out = []
    for f in findings:
        restarted = f.kind == "crash" or (f.kind == "version_change" and f.evidence.get("restart"))
        if restarted and f.ended_at is not None and warmup_s > 0:
            out.append(WarmupWindow(f.role, f.ended_at, f.ended_at + timedelta(seconds=warmup_s)))
    return out


# -- the store ------------------------------------------------------------------------------


def utc_window(window: Window) -> tuple[datetime, datetime]:
    lo, hi = as_utc(window[0]), as_utc(window[1])
    if hi <= lo:
        raise ValueError(f"window end {hi.isoformat()} is not after its start {lo.isoformat()}")
    return lo, hi


def epoch_bin(engine: Engine, column: Any, bin_s: int) -> Any:
    """SQL for ``floor(epoch seconds of column / bin_s)`` on PostgreSQL and SQLite."""
    if engine.dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column) / bin_s), Integer)
    return cast(func.strftime("%s", column), Integer) / bin_s


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
            by_engine[e.engine].append(_ts(e.sent_at))
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


def _count_failures(conn: Connection, in_window: tuple[Any, ...]) -> Counter[str]:
    x = EXCHANGES.c
    q = (
        select(x.role, func.count())
        .where(*in_window, x.status.in_(FAILED_STATUSES))
        .group_by(x.role)
    )
    return Counter({role: int(n) for role, n in conn.execute(q)})


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
    """Read what detection needs, bounded: health samples where something changed (LAG/LEAD
    in SQL), memory in ``leak_bin_s`` bins, exchanges sent per role (an index-only count) and
    per minute only around failures, and only the exchanges that failed, timed out or stalled
    (one filtered pass; the inter-token gaps are looked at only for answers that lasted at
    least ``hang_stall_s``)."""
    lo, hi = utc_window(window)
    h = HEALTH.c
    iteration = h.metrics["iter"].as_float()
    prev = {
        "up": func.lag(h.up).over(partition_by=h.engine, order_by=h.ts),
        "next_up": func.lead(h.up).over(partition_by=h.engine, order_by=h.ts),
        "pst": func.lag(h.process_start_time).over(partition_by=h.engine, order_by=h.ts),
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
    x = EXCHANGES.c
    in_window = (x.deployment == deployment, x.sent_at >= lo, x.sent_at < hi)
    # Per role: an index-only scan of (deployment, role, sent_at), parallel on PostgreSQL.
    totals_q = (
        select(x.role, func.count(), func.min(x.sent_at), func.max(x.sent_at))
        .where(*in_window)
        .group_by(x.role)
    )
    itl = max_itl(engine)
    events_q = (
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
            x.sent_at >= lo,
            x.sent_at < hi,
            or_(
                x.status != "ok",
                x.ttft_s >= config.hang_stall_s,
                # A gap that long makes the whole answer at least that long: the cheap test
                # first, the per-row array scan only for the few that pass it.
                and_(x.e2e_s >= config.hang_stall_s, gap_at_least(engine, config.hang_stall_s)),
            ),
        )
        .order_by(x.sent_at)
        .limit(max_events + 1)
    )
    with translate(), engine.connect() as conn:
        health = [
            HealthPoint(
                r[0], r[1], as_utc(r[2]), bool(r[3]), r[4], r[5], r[6], r[7], r[8], iteration=r[9]
            )
            for r in conn.execute(changes)
        ]
        memory = []
        seen: dict[str, list[float]] = defaultdict(list)
        for r in conn.execute(memory_q):
            first, last = _ts(r[2]), _ts(r[3])
            seen[r[0]] += [first, last]
            if r[4] is None and r[5] is None:
                continue
            memory.append(
                HealthPoint(
                    r[0],
                    r[1],
                    _dt((first + last) / 2),
                    True,
                    gpu_mem_bytes=None if r[4] is None else int(r[4]),
                    cpu_mem_bytes=None if r[5] is None else int(r[5]),
                )
            )
        sent = SentCounts(60.0, by_role=True)
        role_sent: dict[str, int] = {}
        for role, n, first, last in conn.execute(totals_q):
            role_sent[role] = int(n)
            key = sent.key("", role)
            a, b = _ts(first), _ts(last)
            old = sent.extent.get(key, (a, b))
            sent.extent[key] = (min(a, old[0]), max(b, old[1]))
            sent.totals[key] = sent.totals.get(key, 0) + int(n)
        events = [
            ExchangeEvent(r[0], r[1], as_utc(r[2]), r[3], r[4], r[5], r[6], r[7], r[8])
            for r in conn.execute(events_q)
        ]
        # Exchanges sent per minute, only around failures (where an error burst could be).
        ranges = spans_around(
            burst_candidates(events, config),
            config.burst_window_s + 60.0,
            _ts(lo),
            _ts(hi),
            MAX_COUNT_RANGES,
        )
        counted: dict[str, Counter[int]] = defaultdict(Counter)
        if ranges:
            sent_bin = epoch_bin(engine, x.sent_at, 60)
            near = or_(*(and_(x.sent_at >= _dt(a), x.sent_at < _dt(b)) for a, b in ranges))
            bins_q = (
                select(x.role, sent_bin, func.count())
                .where(x.deployment == deployment, near)
                .group_by(x.role, sent_bin)
            )
            for role, b, n in conn.execute(bins_q):
                counted[sent.key("", role)][int(b)] += int(n)
        binned = SentCounts.from_bins(counted, 60.0)
        sent.bins = binned.bins
        truncated = len(events) > max_events
        if truncated:
            failed_by_role = _count_failures(conn, in_window)
        else:
            failed_by_role = Counter(e.role for e in events if e.status in FAILED_STATUSES)
    outcomes = {
        role: {"sent": role_sent.get(role, 0), "failed": int(failed_by_role.get(role, 0))}
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
    )


def detect_incidents(
    engine: Engine,
    deployment: str,
    window: Window,
    config: IncidentConfig = IncidentConfig(),
) -> list[Finding]:
    """Every incident of ``deployment`` in ``window`` (not stored: see :func:`store_incidents`)."""
    return detect_all(load_detection_input(engine, deployment, window, config), config)


def _overlaps(a0: float, a1: float | None, b0: float, b1: float | None, slack: float) -> bool:
    a_end = math.inf if a1 is None else a1
    b_end = math.inf if b1 is None else b1
    return a0 <= b_end + slack and b0 <= a_end + slack


def _last_seen(row: Mapping[str, Any]) -> float:
    """Where a stored incident still open (no end) was last seen going on: a later incident
    of the same kind must not be merged into it just because it never closed."""
    ev = row.get("evidence") or {}
    seen = [_ts(row["started_at"])]
    for key in ("last_window_end", "still_down_at"):
        if ev.get(key):
            seen.append(_ts(datetime.fromisoformat(ev[key])))
    return max(seen)


def store_incidents(engine: Engine, deployment: str, findings: Sequence[Finding]) -> int:
    """Write ``findings`` to ``incidents``; return how many rows are new.

    Idempotent: a finding with the same (engine, kind, started_at) as a stored incident, or
    overlapping one in time, updates that row (start widened to the earlier, end to the later,
    evidence replaced) instead of adding one. The role is kept in ``evidence.role``."""
    if not findings:
        return 0
    inc = INCIDENTS.c
    new = 0
    with translate(), engine.begin() as conn:
        ins = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        conn.execute(ins(DEPLOYMENTS).on_conflict_do_nothing(), [{"name": deployment}])
        engines = sorted({f.engine for f in findings})
        stored = [
            dict(r._mapping)
            for r in conn.execute(
                select(
                    inc.id, inc.engine, inc.kind, inc.started_at, inc.ended_at, inc.evidence
                ).where(inc.deployment == deployment, inc.engine.in_(engines))
            )
        ]
        for f in sorted(findings, key=lambda f: (f.started_at, f.engine, f.kind)):
            f0, f1 = _ts(f.started_at), (_ts(f.ended_at) if f.ended_at else None)
            match = None
            for row in stored:
                if row["engine"] != f.engine or row["kind"] != f.kind:
                    continue
                r0 = _ts(row["started_at"])
                r1 = _ts(row["ended_at"]) if row["ended_at"] else _last_seen(row)
                if r0 == f0 or _overlaps(f0, f1, r0, r1, 0.0):
                    match = row
                    break
            evidence = {**f.evidence, "role": f.role}
            if match is None:
                result = conn.execute(
                    INCIDENTS.insert().values(
                        deployment=deployment,
                        engine=f.engine,
                        kind=f.kind,
                        started_at=f.started_at,
                        ended_at=f.ended_at,
                        evidence=evidence,
                    )
                )
                new += 1
                stored.append(
                    {
                        "id": (result.inserted_primary_key or [None])[0],
                        "engine": f.engine,
                        "kind": f.kind,
                        "started_at": f.started_at,
                        "ended_at": f.ended_at,
                        "evidence": evidence,
                    }
                )
                continue
            start = min(as_utc(match["started_at"]), f.started_at)
            ends = [as_utc(match["ended_at"]) if match["ended_at"] else None, f.ended_at]
            end = None if f.ended_at is None else max(e for e in ends if e is not None)
            conn.execute(
                INCIDENTS.update()
                .where(inc.id == match["id"])
                .values(started_at=start, ended_at=end, evidence=evidence, detected_at=func.now())
            )
            match.update(started_at=start, ended_at=end, evidence=evidence)
    return new


# -- exposure and the section ---------------------------------------------------------------


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
        s, e = max(_ts(b), _ts(lo)), min(_ts(b_end), _ts(hi))
        row: dict[str, Any] = {"bucket": bucket_label(b, by), "start": b.isoformat()}
        totals = {}
        for role in ROLES:
            days = overlap_s(exposure.get(role, ()), s, e) / 86400.0
            counts = {
                k: sum(
                    1
                    for f in findings
                    if f.role == role and f.kind == k and s <= _ts(f.started_at) < e
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


@dataclass
class IncidentSection:
    """Incidents of one deployment over one window: what :func:`analyze_incidents` returns."""

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

    def count(self, role: str, kind: str) -> int:
        return sum(1 for f in self.findings if f.role == role and f.kind == kind)

    def measurements(self) -> list[Measurement]:
        out: list[Measurement] = []
        days = self.exposure_days
        for kind in KINDS:
            c = self.comparisons.get(kind)
            n_c, n_i = self.count("candidate", kind), self.count("incumbent", kind)
            out.append(
                Measurement(
                    key=f"incidents.{kind}.rate_ratio",
                    value=None if c is None else c.ratio,
                    interval=None if c is None else c.interval,
                    n=n_c + n_i,
                    unit="ratio",
                    detail=(
                        f"candidate {n_c} in {days.get('candidate', 0.0):.2f} observed days vs"
                        f" incumbent {n_i} in {days.get('incumbent', 0.0):.2f}; exact"
                        " conditional binomial test"
                        + ("" if c is None else f", p = {c.p_value:.3g}")
                    ),
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
                    + ("" if e is None else f", p = {e.p_value:.3g}")
                ),
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
                    " over its longest run between restarts"
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
                " longest stretch between restarts)"
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
            "measurements": [m.to_dict() for m in self.measurements()],
        }


def load_failure_counts(
    engine: Engine, deployment: str, window: Window
) -> dict[str, dict[str, int]]:
    """Per role (incumbent, candidate): exchanges sent and failed (http_error, timeout,
    connection_error); cancelled exchanges are in neither count."""
    lo, hi = utc_window(window)
    x = EXCHANGES.c
    failed = func.sum(case((x.status.in_(FAILED_STATUSES), 1), else_=0))
    q = (
        select(x.role, func.count(), failed)
        .where(
            x.deployment == deployment,
            x.sent_at >= lo,
            x.sent_at < hi,
            x.role.in_(ROLES),
            x.status != "cancelled",
        )
        .group_by(x.role)
    )
    out = {role: {"sent": 0, "failed": 0} for role in ROLES}
    with translate(), engine.connect() as conn:
        for role, sent, nfail in conn.execute(q):
            out[role] = {"sent": int(sent), "failed": int(nfail or 0)}
    return out


def analyze_incidents(
    engine: Engine,
    deployment: str,
    window: Window,
    config: IncidentConfig = IncidentConfig(),
    progress: Progress | None = None,
) -> IncidentSection:
    """Detect and store the window's incidents, and compare the engines' incident and error
    rates (measurement keys ``incidents.*`` and ``errors.rate_ratio``)."""

    def step(name: str, frac: float) -> None:
        if progress is not None:
            progress(name, frac)

    window = utc_window(window)
    step("loading health and exchanges", 0.0)
    data = load_detection_input(engine, deployment, window, config)
    step("detecting incidents", 0.4)
    findings = detect_all(data, config)
    step("storing incidents", 0.7)
    stored = store_incidents(engine, deployment, findings)
    step("comparing rates", 0.8)
    roles = data.roles()
    observed = data.observed_by_engine(config.health_max_gap_s)
    exposure = role_intervals(observed, roles, data.sent, config.health_max_gap_s)
    lo, hi = _ts(window[0]), _ts(window[1])
    days = {role: overlap_s(exposure[role], lo, hi) / 86400.0 for role in ROLES}
    comparisons: dict[str, RateComparison | None] = {}
    for kind in KINDS:
        if days["candidate"] > 0 and days["incumbent"] > 0:
            x1 = sum(1 for f in findings if f.role == "candidate" and f.kind == kind)
            x2 = sum(1 for f in findings if f.role == "incumbent" and f.kind == kind)
            comparisons[kind] = compare_poisson_rates(
                x1, days["candidate"], x2, days["incumbent"], config.level
            )
        else:
            comparisons[kind] = None
    errors = data.outcomes or load_failure_counts(engine, deployment, window)
    error_comparison = compare_failure_shares(
        errors["candidate"]["failed"],
        errors["candidate"]["sent"],
        errors["incumbent"]["failed"],
        errors["incumbent"]["sent"],
        config.level,
    )
    memory_points = data.memory_by_engine()
    restarts: dict[str, list[float]] = defaultdict(list)
    for f in findings:
        restarts[f.engine].extend(restart_times([f]))
    memory: dict[str, dict[str, Slope]] = {}
    for eng, pts in memory_points.items():
        role = roles.get(eng)
        if role in ROLES:
            for series, s in memory_trends(pts, restarts[eng], config).items():
                best = memory.setdefault(role, {}).get(series)
                if best is None or s.mb_per_hour > best.mb_per_hour:
                    memory[role][series] = s
    section = IncidentSection(
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
        stored_new=stored,
        truncated=data.truncated,
    )
    step("incidents done", 1.0)
    return section
