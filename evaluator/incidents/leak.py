"""Memory leaks: a robust slope (Theil-Sen) over sliding windows of one memory series.

Pure functions over plain sequences (Unix seconds, bytes); :mod:`evaluator.incidents.exchanges`
feeds them each engine's ``gpu_mem_bytes`` and ``cpu_mem_bytes`` from the health samples.

How a leak is found:

1. The series is cut at every restart (memory resets when the process restarts), and each piece
   reduced to bins of ``bin_s`` seconds (median time and median value per bin), so a window holds
   a bounded number of points whatever the scrape interval.
2. Windows of ``window_s`` seconds start on a grid of ``step_s`` seconds aligned to the Unix
   epoch (the same data always gives the same windows, whatever the report's window). A window
   that contains a restart is skipped; so is one with fewer than ``min_points`` bins or whose
   bins cover less than ``min_coverage`` of it.
3. Each window gets the Theil-Sen slope and confidence interval (the numbers of
   :func:`scipy.stats.theilslopes`, computed here without its per-call overhead), in MB per
   hour (MB = 2**20 bytes, as engines and the simulator report memory).
4. Consecutive windows whose *lower* bound is above ``threshold_mb_h`` form a run; runs split
   only by a restart (next run within ``merge_gap_s``) are one leak (the memory reset, the leak
   did not stop). A leak is reported when the lower bound stayed above the threshold for at
   least ``sustain_s``: from the first qualifying window's start to the last one's start (plus
   a step), plus a whole window when the leak is still on at the end of the data. (Window ends
   would overstate a short growth by a window length.)
5. The reported rate is the Theil-Sen slope (with its interval) over the bins of the leak's
   longest run from its first window's end on (the first window may start before the leak),
   or over the whole run when that leaves less than a window: more data than one window, so a
   tighter interval.

Errors: ``ValueError`` for series of unequal lengths (a caller's bug).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

Floats = Sequence[float] | np.ndarray
"""Plain sequences or numpy arrays of floats."""

TREND_POINTS = 400
"""Most bins a whole-piece trend is fitted on (Theil-Sen costs n^2 pairs)."""

MB = float(2**20)
"""Bytes in the MB of "MB/hour" (engines report MiB; the simulator's ``mb_per_hour`` too)."""


@dataclass(frozen=True)
class LeakParams:
    window_s: float = 2 * 3600.0
    step_s: float = 15 * 60.0
    threshold_mb_h: float = 20.0
    sustain_s: float = 3 * 3600.0
    bin_s: float = 120.0
    min_points: int = 10
    min_coverage: float = 0.8
    merge_gap_s: float | None = None
    """Largest gap between runs split by a restart that still makes one leak; None = one
    window length."""
    level: float = 0.95


@dataclass(frozen=True)
class Slope:
    """A Theil-Sen slope in MB/hour with its confidence interval, over ``[start, end]``."""

    mb_per_hour: float
    low: float
    high: float
    n: int
    start: float
    end: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "mb_per_hour": self.mb_per_hour,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "start": self.start,
            "end": self.end,
        }


@dataclass(frozen=True)
class Leak:
    """One sustained leak in one series: its extent, rate and the runs that make it up."""

    start: float
    end: float
    rate: Slope
    runs: list[Slope] = field(default_factory=list)
    """One per run of windows (several when restarts cut the leak); each run's own slope."""
    windows: int = 0
    max_window_mb_h: float = 0.0
    ongoing: bool = False
    """True when the last run reaches the end of the data (the leak had not stopped)."""


def theil_sen(t_s: Floats, values: Floats, level: float = 0.95) -> Slope:
    """Theil-Sen slope of ``values`` (bytes) over ``t_s`` (seconds), in MB/hour."""
    if len(t_s) != len(values):
        raise ValueError(f"{len(t_s)} times but {len(values)} values")
    t = np.asarray(t_s, dtype=float)
    y = np.asarray(values, dtype=float) / MB
    if len(t) < 2 or float(t[-1] - t[0]) <= 0:
        return Slope(math.nan, math.nan, math.nan, len(t), _first(t), _last(t))
    hours = (t - t[0]) / 3600.0
    slope, low, high = theil_sen_slopes(hours, y, level)
    return Slope(slope, low, high, len(t), float(t[0]), float(t[-1]))


@functools.lru_cache(maxsize=8)
def _z(level: float) -> float:
    return float(stats.norm.ppf((1.0 - level) / 2.0))


def _tie_term(v: np.ndarray) -> float:
    _, counts = np.unique(v, return_counts=True)
    k = counts[counts > 1].astype(float)
    return float(np.sum(k * (k - 1) * (2 * k + 5)))


def theil_sen_slopes(
    x: np.ndarray, y: np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """(slope, low, high): the same numbers as :func:`scipy.stats.theilslopes` (median of
    pairwise slopes; Sen's 1968 interval with its tie correction), without its per-call
    overhead (~7 ms), which thousands of windows a month would pay."""
    dx = x[:, None] - x[None, :]
    dy = y[:, None] - y[None, :]
    pos = dx > 0
    slopes = np.sort(dy[pos] / dx[pos])
    nt = len(slopes)
    if nt == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(slopes))
    n = len(y)
    sigsq = (n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y)) / 18.0
    if sigsq < 0:
        return med, math.nan, math.nan
    z = _z(level)
    sigma = math.sqrt(sigsq)
    ru = min(round((nt - z * sigma) / 2.0), nt - 1)
    rl = max(round((nt + z * sigma) / 2.0) - 1, 0)
    return med, float(slopes[rl]), float(slopes[ru])


def _first(t: np.ndarray) -> float:
    return float(t[0]) if len(t) else math.nan


def _last(t: np.ndarray) -> float:
    return float(t[-1]) if len(t) else math.nan


def binned(t_s: Floats, values: Floats, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Median time and median value per ``bin_s`` bin (bins on the epoch grid), in order."""
    t = np.asarray(t_s, dtype=float)
    y = np.asarray(values, dtype=float)
    if len(t) == 0 or bin_s <= 0:
        return t, y
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    keys = np.floor(t / bin_s)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(t)]
    lo, hi = starts + (ends - starts - 1) // 2, starts + (ends - starts) // 2
    ys = y[np.lexsort((y, keys))]  # values sorted within each bin (bins stay in time order)
    tb = (t[lo] + t[hi]) / 2.0
    yb = (ys[lo] + ys[hi]) / 2.0
    return tb, yb


def split_at(t_s: Floats, restarts: Floats) -> list[tuple[float, float, int, int]]:
    """Pieces of a sorted time series between restarts: (lo, hi, i, j) where ``t_s[i:j]`` lies in
    ``[lo, hi)``; ``lo``/``hi`` are the restart times around it (-inf/inf at the ends)."""
    cuts = sorted(r for r in restarts if math.isfinite(r))
    bounds = [-math.inf, *cuts, math.inf]
    t = np.asarray(t_s, dtype=float)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        i = int(np.searchsorted(t, lo, side="left"))
        j = int(np.searchsorted(t, hi, side="left"))
        if j > i:
            out.append((lo, hi, i, j))
    return out


def window_slopes(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> list[tuple[int, float, Slope]]:
    """Every usable window's slope: (piece index, window start, slope), in time order."""
    if len(t_s) != len(values):
        raise ValueError(f"{len(t_s)} times but {len(values)} values")
    order = np.argsort(np.asarray(t_s, dtype=float), kind="stable")
    t_all = np.asarray(t_s, dtype=float)[order]
    y_all = np.asarray(values, dtype=float)[order]
    out: list[tuple[int, float, Slope]] = []
    w, step = params.window_s, params.step_s
    for k, (lo, hi, i, j) in enumerate(split_at(t_all, restarts)):
        tb, yb = binned(t_all[i:j], y_all[i:j], params.bin_s)
        if len(tb) < params.min_points:
            continue
        need = params.min_coverage * w
        g = math.ceil(max(lo, float(tb[0]) - (w - need)) / step) * step
        while g + need <= tb[-1] and g + w <= hi:
            a = int(np.searchsorted(tb, g, side="left"))
            b = int(np.searchsorted(tb, g + w, side="left"))
            if b - a >= params.min_points and tb[b - 1] - tb[a] >= need - params.bin_s:
                out.append((k, g, theil_sen(tb[a:b], yb[a:b], params.level)))
            g += step
    return out


def find_leaks(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> list[Leak]:
    """Sustained leaks in one memory series (see the module docstring)."""
    windows = window_slopes(t_s, values, restarts, params)
    w, step = params.window_s, params.step_s
    merge_gap = params.merge_gap_s if params.merge_gap_s is not None else w
    # Runs of consecutive qualifying windows within one piece.
    runs: list[list[tuple[int, float, Slope]]] = []
    for item in windows:
        piece, g, slope = item
        if not slope.low > params.threshold_mb_h:
            continue
        if runs and runs[-1][-1][0] == piece and abs(runs[-1][-1][1] + step - g) < 1e-6:
            runs[-1].append(item)
        else:
            runs.append([item])
    # Runs split only by a restart are one leak.
    groups: list[list[list[tuple[int, float, Slope]]]] = []
    for run in runs:
        if groups:
            prev = groups[-1][-1]
            prev_end = prev[-1][1] + w
            if prev[-1][0] != run[0][0] and run[0][1] - prev_end <= merge_gap:
                groups[-1].append(run)
                continue
        groups.append([run])
    t_sorted = np.sort(np.asarray(t_s, dtype=float))
    y_by_t = np.asarray(values, dtype=float)[
        np.argsort(np.asarray(t_s, dtype=float), kind="stable")
    ]
    data_end = float(t_sorted[-1]) if len(t_sorted) else math.nan
    out: list[Leak] = []
    for group in groups:
        start = group[0][0][1]
        end = group[-1][-1][1] + w
        first = int(np.searchsorted(t_sorted, start, side="left"))
        start = max(start, float(t_sorted[first])) if first < len(t_sorted) else start
        end = min(end, data_end)
        ongoing = group[-1][-1][1] + w >= data_end - step
        held = group[-1][-1][1] - group[0][0][1] + step + (w if ongoing else 0.0)
        if held < params.sustain_s:
            continue
        run_slopes = []
        for run in group:
            lo_t, hi_t = run[0][1], run[-1][1] + w
            if hi_t - (lo_t + w) >= w:
                # The leak surely runs from the first window's end on; before it, the window
                # may hold a flat stretch that would bias the rate down.
                lo_t += w
            a = int(np.searchsorted(t_sorted, lo_t, side="left"))
            b = int(np.searchsorted(t_sorted, hi_t, side="left"))
            tb, yb = binned(t_sorted[a:b], y_by_t[a:b], params.bin_s)
            run_slopes.append(theil_sen(tb, yb, params.level))
        longest = max(run_slopes, key=lambda s: s.end - s.start)
        out.append(
            Leak(
                start=start,
                end=end,
                rate=longest,
                runs=run_slopes,
                windows=sum(len(r) for r in group),
                max_window_mb_h=max(s.mb_per_hour for r in group for _, _, s in r),
                ongoing=ongoing,
            )
        )
    return out


def trend(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> Slope | None:
    """The slope over the longest piece between restarts (binned): a series' overall memory
    trend, reported when no leak was found; None without enough points."""
    order = np.argsort(np.asarray(t_s, dtype=float), kind="stable")
    t_all = np.asarray(t_s, dtype=float)[order]
    y_all = np.asarray(values, dtype=float)[order]
    best: Slope | None = None
    for _lo, _hi, i, j in split_at(t_all, restarts):
        tb, yb = binned(t_all[i:j], y_all[i:j], params.bin_s)
        if len(tb) > TREND_POINTS:  # pairwise slopes are O(n^2): coarser bins for long pieces
            tb, yb = binned(tb, yb, (tb[-1] - tb[0]) / (TREND_POINTS - 1) + 1e-9)
        if len(tb) < params.min_points:
            continue
        s = theil_sen(tb, yb, params.level)
        if best is None or s.end - s.start > best.end - best.start:
            best = s
    return best
