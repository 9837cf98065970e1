"""The engines' memory side by side: growth compared (candidate minus incumbent), and each
engine's memory level and peak per version.

:func:`compare_memory` is pure. For each memory series (``gpu_mem_bytes``, ``cpu_mem_bytes``)
and role it pools the growth of every process life of the role's engines
(:func:`evaluator.incidents.leak.growth`: warm-up left out after every start, least-squares
slope per epoch with its standard error widened for AR(1) noise, epochs pooled by inverse
variance), and judges the candidate's growth minus the incumbent's
(``incidents.leak.excess_mb_per_hour``, :func:`evaluator.incidents.leak.excess_growth`, at the
section's ``level``). Growth both engines share (the load's, a slow daily cycle seen by both)
cancels; a leak of the candidate's own does not.

What the interval assumes: memory noise roughly AR(1) (memory of minutes) within each series,
the two engines' series independent. It does not cover a swing with memory of hours seen by one
engine only (a daily cycle in one engine's memory adds to the slope's error more than the
interval says); many epochs average it out.

Levels: per role, engine version and series, the median and the peak of the binned memory
(MB = 2**20 bytes) and the hours seen; the version of a bin is the last version the engine
reported at or before it.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluator.incidents.leak import MB, Growth, LeakParams, excess_growth
from evaluator.incidents.leak import growth as series_growth
from evaluator.incidents.model import MEMORY_SERIES, ROLES, HealthPoint, unix_s, utc_at
from evaluator.results import Interval, Measurement

KEY = "incidents.leak.excess_mb_per_hour"
DEFAULT_PARAMS = LeakParams()


@dataclass(frozen=True)
class Excess:
    series: str
    value: float
    low: float
    high: float
    level: float
    against: str | None = None
    """The incumbent's series it was compared with (None: the incumbent had no memory data,
    the candidate's own growth is judged)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "against": self.against,
            "mb_per_hour": self.value,
            "low": self.low,
            "high": self.high,
            "level": self.level,
        }


@dataclass
class MemoryComparison:
    """What :func:`compare_memory` returns (``to_dict`` for the report)."""

    growth: dict[str, dict[str, Growth]] = field(default_factory=dict)
    """role -> series -> pooled growth."""
    excess: dict[str, Excess] = field(default_factory=dict)
    """series -> candidate minus incumbent growth."""
    levels: list[dict[str, Any]] = field(default_factory=list)
    level: float = 0.95

    def measurement(self) -> Measurement:
        if not self.excess:
            return Measurement(
                KEY,
                None,
                None,
                0,
                "MB/hour",
                "no memory series seen on both engines (gpu_mem_bytes / cpu_mem_bytes)",
            )
        top = max(self.excess.values(), key=lambda e: e.value)
        cand = self.growth["candidate"][top.series]
        if top.against is None:
            inc_text = "the incumbent reported no memory: the candidate's own growth"
            n = cand.n_eff
        else:
            inc = self.growth["incumbent"][top.against]
            inc_text = (
                f"minus incumbent ({top.against}) {inc.mb_per_hour:+.1f} MB/h over"
                f" {inc.epochs}, {inc.hours:.1f} h"
            )
            n = min(cand.n_eff, inc.n_eff)
        return Measurement(
            KEY,
            top.value,
            Interval(top.low, top.high, top.level),
            round(n),
            "MB/hour",
            (
                f"{top.series}: candidate {cand.mb_per_hour:+.1f} MB/h over {cand.epochs}"
                f" process life(s), {cand.hours:.1f} h, {inc_text}; least squares per process"
                " life after its warm-up, standard errors widened for autocorrelated (AR(1))"
                " noise, lives pooled by inverse variance; the series with the larger excess"
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "growth": {
                role: {s: g.to_dict() for s, g in by.items()} for role, by in self.growth.items()
            },
            "excess": {s: e.to_dict() for s, e in self.excess.items()},
            "levels": self.levels,
            "level": self.level,
        }


ZERO = Growth(0.0, 0.0, math.inf, 0, 0.0, 0.0)
"""No growth, known exactly: what an incumbent without memory data is compared as."""


def _pool(parts: Sequence[Growth]) -> Growth | None:
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    w = np.array([1.0 / max(g.se, 1e-12) ** 2 for g in parts])
    slope = float(np.sum(w * np.array([g.mb_per_hour for g in parts])) / np.sum(w))
    return Growth(
        slope,
        float(math.sqrt(1.0 / np.sum(w))),
        sum(g.n_eff for g in parts),
        sum(g.epochs for g in parts),
        sum(g.hours for g in parts),
        max(g.rho for g in parts),
    )


def _version_at(changes: Sequence[tuple[float, str]], t: float) -> str:
    i = bisect.bisect_right([c[0] for c in changes], t) - 1
    return changes[i][1] if i >= 0 else (changes[0][1] if changes else "unknown")


def compare_memory(
    memory: Mapping[str, Sequence[HealthPoint]],
    health: Mapping[str, Sequence[HealthPoint]],
    roles: Mapping[str, str],
    restarts: Mapping[str, Sequence[float]],
    params: LeakParams = DEFAULT_PARAMS,
) -> MemoryComparison:
    """Growth per role and series, the candidate's excess, and levels per version (see the
    module docstring). ``memory``/``health``: points per engine; ``restarts``: each engine's
    process starts (Unix seconds)."""
    parts: dict[str, dict[str, list[Growth]]] = defaultdict(lambda: defaultdict(list))
    levels: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for eng, pts in memory.items():
        role = roles.get(eng)
        if role not in ROLES:
            continue
        changes = sorted(
            (unix_s(p.ts), p.version) for p in health.get(eng, ()) if p.version is not None
        )
        versions = [(t, str(v)) for t, v in changes]
        for series in MEMORY_SERIES:
            tv = [(unix_s(p.ts), float(v)) for p in pts if (v := getattr(p, series)) is not None]
            if not tv:
                continue
            t, y = (np.array(c) for c in zip(*tv, strict=True))
            g = series_growth(t, y, restarts.get(eng, ()), params)
            if g is not None:
                parts[role][series].append(g)
            for ti, yi in tv:
                levels[(role, _version_at(versions, ti), series)].append((ti, yi))
    out = MemoryComparison(level=params.level)
    for role, by in parts.items():
        for series, gs in by.items():
            pooled = _pool(gs)
            if pooled is not None:
                out.growth.setdefault(role, {})[series] = pooled
    inc_growth = out.growth.get("incumbent", {})
    for series in MEMORY_SERIES:
        cand = out.growth.get("candidate", {}).get(series)
        if cand is None:
            continue
        # Engines of two flavors may report different series: the incumbent's same series,
        # else its other one; an incumbent without memory data leaves the candidate's own.
        against = series if series in inc_growth else next(iter(sorted(inc_growth)), None)
        inc = inc_growth[against] if against is not None else ZERO
        value, low, high = excess_growth(cand, inc, params.level)
        out.excess[series] = Excess(series, value, low, high, params.level, against)
    for (role, version, series), tv in sorted(levels.items()):
        ts = np.array([t for t, _ in tv])
        ys = np.array([y for _, y in tv]) / MB
        out.levels.append(
            {
                "role": role,
                "version": version,
                "series": series,
                "median_mb": float(np.median(ys)),
                "peak_mb": float(np.max(ys)),
                "first": utc_at(float(ts.min())).isoformat(),
                "last": utc_at(float(ts.max())).isoformat(),
                "bins": len(tv),
            }
        )
    return out
