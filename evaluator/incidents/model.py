"""What incident detection reads and writes, as plain values: the thresholds
(:class:`IncidentConfig`), one incident (:class:`Finding`), and the input
(:class:`HealthPoint`, :class:`ExchangeEvent`, :class:`SentCounts`, together a
:class:`DetectionInput`).

No SQL and no detection here: :mod:`evaluator.incidents.load` builds a :class:`DetectionInput`
from the store, :mod:`evaluator.incidents.analysis` turns it into findings.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from evaluator.incidents.leak import LeakParams
from evaluator.rates import observed_intervals
from evaluator.results import Window
from shadow_ab.timestamps import as_utc

KINDS: tuple[str, ...] = ("crash", "version_change", "leak", "error_burst", "hang")
ROLES: tuple[str, ...] = ("incumbent", "candidate")
MEMORY_SERIES: tuple[str, ...] = ("gpu_mem_bytes", "cpu_mem_bytes")
FAILED_STATUSES: tuple[str, ...] = ("http_error", "timeout", "connection_error")
"""Exchange statuses that count as failures (``cancelled`` is the mirror's doing: neither)."""


def unix_s(d: datetime) -> float:
    """Unix seconds of ``d`` (naive = UTC)."""
    return as_utc(d).timestamp()


def utc_at(t: float) -> datetime:
    """The aware UTC datetime of Unix seconds ``t``."""
    return datetime.fromtimestamp(t, UTC)


def utc_window(window: Window) -> tuple[datetime, datetime]:
    """``window`` in UTC; ``ValueError`` when it is empty."""
    lo, hi = as_utc(window[0]), as_utc(window[1])
    if hi <= lo:
        raise ValueError(f"window end {hi.isoformat()} is not after its start {lo.isoformat()}")
    return lo, hi


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
    leak_threshold_mb_h: float = 20.0
    """A leak's interval must lie above this (MB/hour)."""
    leak_sustain_h: float = 6.0
    """...over a stretch of one process's life at least this long (see
    :mod:`evaluator.incidents.leak`: with memory noise that lingers for minutes, a shorter
    stretch cannot tell 20 MB/h from noise)."""
    leak_max_span_h: float = 24.0
    """Longest stretch judged at once (a longer leak is several)."""
    leak_step_min: float = 15.0
    """Stretches start and end on a grid of this step."""
    leak_warmup_min: float = 30.0
    """Left out after each process start, before the data-driven refill test."""
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
    episode_gap_s: float = 1800.0
    """Incidents of one kind on one role starting within this of the previous one's end are one
    episode (a crash loop is one event, not ten) when rates are compared."""
    shadow_timeout_s: float | None = None
    """The mirror's ``shadow.timeout_s``: both roles are censored there (an incumbent answer
    that ran longer counts as the timeout the candidate would have had). None: read from the
    candidate's timeout errors, else the mirror's default 120 s."""

    def for_time_scale(self, scale: float) -> IncidentConfig:
        """The same detection for a simulator running ``scale`` simulated seconds per real
        second (health samples carry real time): durations on the fault timeline (leak
        stretches, steps, warm-up, bins, clustering, crash margin, burst window, observed-time
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
            leak_threshold_mb_h=self.leak_threshold_mb_h * scale,
            leak_sustain_h=self.leak_sustain_h / scale,
            leak_max_span_h=self.leak_max_span_h / scale,
            leak_step_min=self.leak_step_min / scale,
            leak_warmup_min=self.leak_warmup_min / scale,
            leak_bin_s=self.leak_bin_s / scale,
            burst_window_s=self.burst_window_s / scale,
            episode_gap_s=self.episode_gap_s / scale,
        )

    @property
    def leak_params(self) -> LeakParams:
        return LeakParams(
            threshold_mb_h=self.leak_threshold_mb_h,
            sustain_s=self.leak_sustain_h * 3600.0,
            max_span_s=self.leak_max_span_h * 3600.0,
            step_s=self.leak_step_min * 60.0,
            warmup_s=self.leak_warmup_min * 60.0,
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


@dataclass
class DetectionInput:
    """Everything detection reads, as plain values (built by :func:`load_detection_input`, or
    by hand in tests)."""

    health: list[HealthPoint]
    """Health samples: every one, or (from the store) only those where something changed and
    the one just before each change."""
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
    outcomes_by_day: dict[str, dict[int, tuple[int, int]]] | None = None
    """Per role: UTC day (days since the Unix epoch) -> (sent, failed), for the overdispersion
    of the failures (bursts); None when not loaded."""
    shadow_timeout_s: float | None = None
    """The timeout both roles were censored at when loading (None: not censored)."""

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
            eng: observed_intervals((unix_s(p.ts) for p in pts), max_gap_s)
            for eng, pts in self.health_by_engine().items()
        }
