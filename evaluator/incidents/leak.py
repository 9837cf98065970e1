"""Memory leaks: growth sustained within one process's life, told from noise, refills and restarts.

Pure functions over plain sequences (Unix seconds, bytes); :mod:`evaluator.incidents.exchanges`
feeds them each engine's ``gpu_mem_bytes`` and ``cpu_mem_bytes`` from the health samples, and
the times its process started. :class:`LeakParams` holds every number below.

How a leak is found:

1. **Epochs.** The series is cut at every process start (restarts, and the first start when the
   engine reports it): memory resets when a process starts, so growth is only ever measured
   within one process's life, an *epoch*. Each epoch is reduced to bins of ``bin_s`` seconds
   (median time and median value per bin).
2. **Warm-up.** After each start, the first ``warmup_s`` are left out, then more, a grid step at
   a time, until the refill is over: until the next ``2 step_s`` of memory lie no more than one
   noise sd below the line fitted to the ``sustain_s`` after them (a refill rises fast and then
   flattens, so until it is over memory sits below the line of what follows; a leak, even one
   that starts with the process, lies on it). At most ``sustain_s`` more.
3. **Noise.** The series' noise is measured once: every stretch of ``sustain_s`` (one from each
   grid point) is fitted by a line; the noise variance is the median of their residual
   variances, its autocorrelation rho the median of their residuals' lag-1 autocorrelations,
   each corrected for its small-sample bias (rho = (n rho_hat + 2) / (n - 6), clipped to
   [0, 0.99]). Medians, because a stretch holding a refill or the bend of a leak fits a line
   poorly; the series', because a short epoch holds too few stretches, and because a scan
   over stretches that each estimated their own noise would pick those whose estimate came
   out low.
4. **Stretches.** Every stretch of an epoch between two points of a grid of ``step_s`` seconds
   (aligned to the Unix epoch, so the same data gives the same stretches whatever the window,
   plus the epoch's usable start and its end), from ``sustain_s`` to ``max_span_s`` long,
   holding at least ``min_points`` bins that cover ``min_coverage`` of it, gets its least-
   squares slope in MB per hour (MB = 2**20 bytes, as engines and the simulator report memory)
   from running sums: the hundreds of thousands of stretches of a month cost a fraction of a
   second.
5. **An interval that survives autocorrelation.** Memory noise is not independent from one bin
   to the next (pools fill and drain over minutes); an interval that treats the bins as
   independent is several times too narrow (AR(1) noise decaying over 15 minutes, sampled
   every 2 minutes: rho = 0.875, and n bins are worth n_eff = n (1 - rho) / (1 + rho) = n / 15
   independent ones). Each stretch's standard error is the least-squares one with the larger
   of its own and the noise's residual variance, multiplied by sqrt(n / n_eff) (the AR(1)
   variance inflation of the trend tests of Yue and Wang 2004; with residuals about a fitted
   line it is unbiased for AR(1) noise at these lengths), and the quantile is Student's t on
   n_eff - 2 degrees of freedom.
6. **Growth.** A stretch grows when the lower end of its interval (two-sided, ``level``) is
   above ``threshold_mb_h`` *and* it is linear: neither half grows significantly slower than
   the other (the difference of the halves' slopes against its standard error under the
   noise, one-sided at ``level`` each way). A saturating refill slows down; a stretch holding a
   short rise between flat memory is bent: growth must hold over the whole stretch.
7. **Leaks.** Overlapping growing stretches of one epoch are one leak. Where it is: the ramp
   (flat, a straight rise of at least ``sustain_s`` between grid points, flat) that fits their
   bins best; its rate is the Theil-Sen slope over the ramp, with Sen's interval widened by
   the same n_eff (Kendall's S variance times n / n_eff, Student's t quantile). The leak stands
   only if that interval's lower end is above the threshold too (the strongest stretches are
   tried when the ramp's is not): scrape glitches can carry a least-squares slope, not a
   median of slopes.
8. **Across a restart.** A restart ends a leak (the memory reset). Leaks of consecutive epochs
   are reported as one when each is a leak on its own, the first ends within ``merge_gap_s`` of
   the restart, the second starts within the warm-up plus ``merge_gap_s`` after it, and their
   intervals overlap (the same growth before and after). Growth on one side is never lengthened
   by the other.

Sustain is measured only over data seen: a leak still going when the data ends is as long as
the data shows. A stretch wholly inside the data is judged the same way at every later look (up
to the noise estimate, which grows with the data), so a leak found at one look stays found.

What it assumes: noise that is roughly AR(1) (memory of minutes, not hours) and stationary over
the series; slower swings (a daily cycle of load) are not noise to it, and one steeper than the
threshold for ``sustain_s`` is growth it reports. Why ``sustain_s`` is 6 hours by default: with
AR(1) noise of sd 50 MiB decaying over 15 minutes, the slope of a stretch of noise has an sd of
about 24 MB/h over 3 hours, 11 over 5 and 8 over 6, and a month holds thousands of stretches:
only from about 6 hours can 20 MB/h be told from noise at every daily look of a month, while a
50 MB/h leak of 6 hours is still found (``bench/leak_validity.py`` measures both).

Errors: ``ValueError`` for series of unequal lengths (a caller's bug).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

Floats = Sequence[float] | np.ndarray
"""Plain sequences or numpy arrays of floats."""

TREND_POINTS = 400
"""Most bins a whole-piece trend is fitted on (Theil-Sen costs n^2 pairs)."""

MB = float(2**20)
"""Bytes in the MB of "MB/hour" (engines report MiB; the simulator's ``mb_per_hour`` too)."""

MAX_RHO = 0.99
"""Largest lag-1 autocorrelation used (n_eff = n / 199 at most)."""


@dataclass(frozen=True)
class LeakParams:
    threshold_mb_h: float = 20.0
    """A leak's interval must lie above this (MB/hour)."""
    sustain_s: float = 6 * 3600.0
    """Shortest stretch of growth that makes a leak."""
    max_span_s: float = 24 * 3600.0
    """Longest stretch judged at once (a longer leak is several overlapping stretches)."""
    step_s: float = 15 * 60.0
    warmup_s: float = 30 * 60.0
    """Left out after each process start, before the data-driven refill test (step 2)."""
    bin_s: float = 120.0
    min_points: int = 10
    min_coverage: float = 0.8
    merge_gap_s: float | None = None
    """Largest gap between a leak and a restart (and the restart and the next leak, after the
    warm-up) for the two to be one leak; None = ``sustain_s``."""
    level: float = 0.95


@dataclass(frozen=True)
class Slope:
    """A slope in MB/hour with its confidence interval, over ``[start, end]``."""

    mb_per_hour: float
    low: float
    high: float
    n: int
    start: float
    end: float
    rho: float = 0.0
    """Lag-1 autocorrelation of the residuals the interval was widened for (0: none)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "mb_per_hour": self.mb_per_hour,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "start": self.start,
            "end": self.end,
            "rho": self.rho,
        }


@dataclass(frozen=True)
class Leak:
    """One sustained leak in one series: its extent, rate and the runs that make it up."""

    start: float
    end: float
    rate: Slope
    runs: list[Slope] = field(default_factory=list)
    """One per epoch (several when a restart interrupted the same growth); each its own slope."""
    stretches: int = 0
    """Growth stretches behind the leak."""
    steepest_mb_h: float = 0.0
    """Steepest of those stretches (least squares)."""
    ongoing: bool = False
    """True when the leak reaches the end of the data (it had not stopped)."""


@functools.lru_cache(maxsize=8)
def _z(level: float) -> float:
    return float(stats.norm.ppf((1.0 - level) / 2.0))


@functools.lru_cache(maxsize=8)
def _t_table(level: float) -> np.ndarray:
    """Two-sided ``level`` quantiles of Student's t for 1..1000 degrees of freedom, by tenths."""
    return np.asarray(stats.t.ppf(1.0 - (1.0 - level) / 2.0, np.arange(10, 10001) / 10.0))


def _t(level: float, df: np.ndarray | float) -> Any:
    """Two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (df rounded
    down to a tenth, at least 1; above 1000 the normal's)."""
    table = _t_table(level)
    k = np.clip(np.floor(np.asarray(df, dtype=float) * 10.0).astype(int) - 10, 0, len(table) - 1)
    return table[k]


@functools.lru_cache(maxsize=8)
def _z_one_sided(level: float) -> float:
    return float(stats.norm.ppf(level))


def ar1_inflation(rho_hat: float, n: int) -> tuple[float, float]:
    """(rho, n / n_eff): the bias-corrected lag-1 autocorrelation of ``n`` residuals and the
    factor their variance is inflated by, (1 + rho) / (1 - rho)."""
    if n <= 6 or not math.isfinite(rho_hat):
        return 0.0, 1.0
    rho = min(MAX_RHO, max(0.0, (n * rho_hat + 2.0) / (n - 6.0)))
    return rho, (1.0 + rho) / (1.0 - rho)


def lag1(residuals: np.ndarray) -> float:
    """Lag-1 autocorrelation of ``residuals`` (0 when they are constant)."""
    r = residuals - residuals.mean()
    den = float(np.dot(r, r))
    return float(np.dot(r[:-1], r[1:]) / den) if den > 0 and len(r) > 2 else 0.0


def theil_sen(
    t_s: Floats,
    values: Floats,
    level: float = 0.95,
    *,
    adjust: bool = True,
    rho: float | None = None,
) -> Slope:
    """Theil-Sen slope of ``values`` (bytes) over ``t_s`` (seconds), in MB/hour, with Sen's
    interval widened for the noise's lag-1 autocorrelation: ``rho`` when known (the series'),
    else the residuals' (bias-corrected); ``adjust=False``: Sen's own interval, for
    independent values."""
    if len(t_s) != len(values):
        raise ValueError(f"{len(t_s)} times but {len(values)} values")
    t = np.asarray(t_s, dtype=float)
    y = np.asarray(values, dtype=float) / MB
    if len(t) < 2 or float(t[-1] - t[0]) <= 0:
        return Slope(math.nan, math.nan, math.nan, len(t), _first(t), _last(t))
    hours = (t - t[0]) / 3600.0
    slopes = _pairwise(hours, y)
    r, inflation = 0.0, 1.0
    if adjust and len(slopes):
        if rho is None:
            median = float(np.median(slopes))
            rho, _ = ar1_inflation(lag1(y - median * hours), len(y))
        r = min(MAX_RHO, max(0.0, rho))
        inflation = (1.0 + r) / (1.0 - r)
    slope, low, high = _sen(hours, y, slopes, level, inflation)
    return Slope(slope, low, high, len(t), float(t[0]), float(t[-1]), r)


def _pairwise(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    dx = x[:, None] - x[None, :]
    dy = y[:, None] - y[None, :]
    pos = dx > 0
    return np.sort(dy[pos] / dx[pos])


def _tie_term(v: np.ndarray) -> float:
    _, counts = np.unique(v, return_counts=True)
    k = counts[counts > 1].astype(float)
    return float(np.sum(k * (k - 1) * (2 * k + 5)))


def theil_sen_slopes(
    x: np.ndarray, y: np.ndarray, level: float = 0.95, *, inflation: float = 1.0
) -> tuple[float, float, float]:
    """(slope, low, high): the same numbers as :func:`scipy.stats.theilslopes` (median of
    pairwise slopes; Sen's 1968 interval with its tie correction), without its per-call
    overhead (~7 ms); ``inflation`` multiplies the variance of Kendall's S (n / n_eff for
    autocorrelated residuals; 1 = scipy's)."""
    return _sen(x, y, _pairwise(x, y), level, inflation)


def _sen(
    x: np.ndarray, y: np.ndarray, slopes: np.ndarray, level: float, inflation: float
) -> tuple[float, float, float]:
    nt = len(slopes)
    if nt == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(slopes))
    n = len(y)
    sigsq = (n * (n - 1) * (2 * n + 5) - _tie_term(x) - _tie_term(y)) / 18.0 * inflation
    if sigsq < 0:
        return med, math.nan, math.nan
    # Widened for autocorrelation, the quantile is Student's t on the effective sample size.
    z = _z(level) if inflation <= 1.0 else -float(_t(level, max(n / inflation - 2.0, 1.0)))
    sigma = math.sqrt(sigsq)
    ru = min(max(round((nt - z * sigma) / 2.0), 0), nt - 1)
    rl = max(min(round((nt + z * sigma) / 2.0) - 1, nt - 1), 0)
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


@dataclass(frozen=True)
class Stretches:
    """The growing stretches of one epoch: bin index ranges ``[a, b)`` with their least-squares
    slope (MB/hour), its autocorrelation-widened standard error and strength."""

    a: np.ndarray
    b: np.ndarray
    slope: np.ndarray
    se: np.ndarray
    strength: np.ndarray
    """(slope - threshold) / se: how far above the threshold the stretch is."""


class _Sums:
    """Running sums of one epoch's bins: any stretch's least-squares fit in O(1)."""

    def __init__(self, t: np.ndarray, y: np.ndarray) -> None:
        def run(v: np.ndarray) -> np.ndarray:
            return np.concatenate(([0.0], np.cumsum(v)))

        self.n = run(np.ones_like(t))
        self.t, self.tt, self.y, self.ty, self.yy = (
            run(t),
            run(t * t),
            run(y),
            run(t * y),
            run(y * y),
        )
        # Consecutive pairs (i, i + 1), by i: for the residuals' lag-1 autocovariance.
        t0, t1, y0, y1 = t[:-1], t[1:], y[:-1], y[1:]
        self.p_yy, self.p_tt = run(y0 * y1), run(t0 * t1)
        self.p_ty, self.p_yt = run(t0 * y1), run(y0 * t1)
        self.p_y0, self.p_y1, self.p_t0, self.p_t1 = run(y0), run(y1), run(t0), run(t1)

    def fit(
        self, a: np.ndarray, b: np.ndarray, *, with_rho: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(slope, residual variance, Sxx, rho_hat) of the bins ``[a, b)``."""

        def s(v: np.ndarray) -> np.ndarray:
            return np.asarray(v[b] - v[a])

        n = s(self.n)
        st, sy = s(self.t), s(self.y)
        sxx = s(self.tt) - st * st / n
        sxy = s(self.ty) - st * sy / n
        syy = s(self.yy) - sy * sy / n
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = sxy / sxx
            rss = np.maximum(syy - slope * sxy, 0.0)
            var = rss / np.maximum(n - 2, 1)
            rho_hat = np.zeros_like(slope)
            if with_rho:
                c = sy / n - slope * st / n  # intercept
                pa, pb = a, np.maximum(b - 1, a)  # pairs (i, i + 1) with a <= i < b - 1

                def p(v: np.ndarray) -> np.ndarray:
                    return np.asarray(v[pb] - v[pa])

                m = pb - pa
                cov = (
                    p(self.p_yy)
                    - c * (p(self.p_y0) + p(self.p_y1))
                    - slope * (p(self.p_ty) + p(self.p_yt))
                    + c * c * m
                    + c * slope * (p(self.p_t0) + p(self.p_t1))
                    + slope * slope * p(self.p_tt)
                )
                rho_hat = np.where(rss > 1e-9 * n, cov / rss, 0.0)  # not for rounding errors
        return slope, var, sxx, rho_hat


class _Epoch:
    """One process's life in one series: its bins, running sums and noise."""

    def __init__(self, tb: np.ndarray, yb: np.ndarray, lo: float, hi: float, end: float) -> None:
        self.tb, self.yb, self.lo, self.hi, self.end = tb, yb, lo, hi, end
        self.origin = float(tb[0])
        self.t_h = (tb - self.origin) / 3600.0
        y_mb = yb / MB
        self.y_mb = y_mb - float(np.median(y_mb))  # running sums stay small
        self.sums = _Sums(self.t_h, self.y_mb)
        self.noise_var, self.noise_rho = 0.0, 0.0
        """The series' noise (:func:`noise`), set by :func:`find_leaks`."""

    def hours(self, t_s: Sequence[float] | np.ndarray) -> np.ndarray:
        return (np.asarray(t_s, dtype=float) - self.origin) / 3600.0

    def grid(self, start: float, params: LeakParams) -> np.ndarray:
        """``start``, the points of the ``step_s`` grid after it, and the epoch's end (hours)."""
        step = params.step_s
        inside = np.arange(math.floor(start / step) + 1, math.ceil(self.end / step)) * step
        return self.hours([start, *inside.tolist(), self.end])

    def noise_blocks(self, start: float, params: LeakParams) -> np.ndarray:
        """Every stretch of ``sustain_s`` from ``start`` on (one from each grid point), each
        about its own line: rows of (residual variance, lag-1 autocorrelation of the
        residuals, bins)."""
        bounds = self.grid(start, params)
        idx = np.searchsorted(self.t_h, bounds, side="left")
        i = np.arange(len(bounds))
        j = np.searchsorted(bounds, bounds + params.sustain_s / 3600.0 - 1e-9, side="left")
        ok = j < len(bounds)
        a, b = idx[i[ok]], idx[j[ok]]
        keep = b - a >= max(params.min_points, 8)
        a, b = a[keep], b[keep]
        if not len(a):
            return np.zeros((0, 3))
        _, var, _, rho_hat = self.sums.fit(a, b, with_rho=True)
        return np.column_stack([var, rho_hat, (b - a).astype(float)])

    def settled(self, start: float, params: LeakParams) -> float | None:
        """Where the refill after the epoch's start is over (Unix seconds): the first grid point
        from ``start`` on where the next ``2 step_s`` of memory lie no more than one noise sd
        below the line of the ``sustain_s`` that follow them, or 1 MB (a refill rises fast,
        then flattens: until it is over, memory sits below the line of what follows; a leak
        lies on it). None while the data cannot tell yet; at most ``sustain_s`` after
        ``start``."""
        early_h, later_h = 2 * params.step_s / 3600.0, params.sustain_s / 3600.0
        tol = max(math.sqrt(self.noise_var), 1.0)  # at least 1 MB: noise-free data rounds
        need = params.min_coverage * later_h
        for g in self.grid(start, params)[:-1]:
            if g >= self.hours([start])[0] + later_h:
                return self.origin + float(g) * 3600.0
            a, m, b = np.searchsorted(self.t_h, [g, g + early_h, g + early_h + later_h])
            if b - m < params.min_points or self.t_h[b - 1] - self.t_h[m] < need - 1e-9:
                return None
            if m - a < 1:
                continue
            slope, _, _, _ = self.sums.fit(np.array([m]), np.array([b]))
            t_l, y_l = self.t_h[m:b], self.y_mb[m:b]
            line = float(np.mean(y_l)) + float(slope[0]) * (self.t_h[a:m] - float(np.mean(t_l)))
            if float(np.mean(line - self.y_mb[a:m])) <= tol:
                return self.origin + float(g) * 3600.0
        return None

    def ramp(self, a0: int, b0: int, start: float, params: LeakParams) -> tuple[int, int] | None:
        """Where the growth is in bins ``[a0, b0)``: the bins ``[a, b)`` of the ramp (flat,
        then a straight rise from L to E at least ``sustain_s`` long, then flat again, L and E
        on the grid) that fits them best by least squares; None if none rises."""
        bounds = self.grid(start, params)
        t0, t1 = self.t_h[a0], self.t_h[b0 - 1]
        g = bounds[(bounds >= t0 - 1e-9) & (bounds <= t1 + 1e-9)]
        g = np.unique(np.concatenate(([t0], g, [t1])))
        p, q = np.triu_indices(len(g), k=1)
        keep = g[q] - g[p] >= params.sustain_s / 3600.0 - 1e-9
        p, q = p[keep], q[keep]
        if not len(p):
            return None
        lo_t, hi_t = g[p], g[q]
        s = self.sums
        ip = np.searchsorted(self.t_h, lo_t, side="left")
        iq = np.searchsorted(self.t_h, hi_t, side="right")
        n_lo, n_hi = ip - a0, b0 - iq
        n = float(b0 - a0)
        sy = s.y[b0] - s.y[a0]
        syy = s.yy[b0] - s.yy[a0]
        sx = lo_t * n_lo + (s.t[iq] - s.t[ip]) + hi_t * n_hi
        sxx = lo_t**2 * n_lo + (s.tt[iq] - s.tt[ip]) + hi_t**2 * n_hi
        sxy = lo_t * (s.y[ip] - s.y[a0]) + (s.ty[iq] - s.ty[ip]) + hi_t * (s.y[b0] - s.y[iq])
        cxx = sxx - sx * sx / n
        cxy = sxy - sx * sy / n
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = cxy / cxx
            rss = syy - sy * sy / n - slope * cxy
        rss = np.where((slope > 0) & (cxx > 0), rss, np.inf)
        best = int(np.argmin(rss))
        if not math.isfinite(float(rss[best])):
            return None
        return int(ip[best]), int(iq[best])

    def stretches(self, start: float, params: LeakParams) -> Stretches:
        """Every growing stretch from ``start`` on (steps 4-6 of the module docstring)."""
        bounds = self.grid(start, params)
        idx = np.searchsorted(self.t_h, bounds, side="left")
        lo_span, hi_span = params.sustain_s / 3600.0, params.max_span_s / 3600.0
        first = np.searchsorted(bounds, bounds + lo_span - 1e-9, side="left")
        last = np.searchsorted(bounds, bounds + hi_span + 1e-9, side="right") - 1
        pairs_i, pairs_j = [], []
        for d in range(1, int(np.max(last - np.arange(len(bounds)), initial=0)) + 1):
            i = np.arange(len(bounds) - d)
            j = i + d
            ok = (j >= first[i]) & (j <= last[i])
            pairs_i.append(i[ok])
            pairs_j.append(j[ok])
        i = np.concatenate(pairs_i) if pairs_i else np.zeros(0, dtype=int)
        j = np.concatenate(pairs_j) if pairs_j else np.zeros(0, dtype=int)
        a, b = idx[i], idx[j]
        n = b - a
        bin_h = params.bin_s / 3600.0
        covered = n * bin_h >= params.min_coverage * (bounds[j] - bounds[i]) - bin_h
        keep = (n >= params.min_points) & covered
        a, b = a[keep], b[keep]
        empty = np.zeros(0)
        if not len(a):
            return Stretches(a, b, empty, empty, empty)
        slope, var, sxx, _ = self.sums.fit(a, b)
        nf = (b - a).astype(float)
        # A stretch's own noise estimates are noisy themselves, and a scan would pick the ones
        # that came out low: the series' variance is a floor, and its autocorrelation is used
        # (a stretch's own is raised by any bend in it, not only by the noise).
        var = np.maximum(var, self.noise_var)
        inflation = (1.0 + self.noise_rho) / (1.0 - self.noise_rho)
        with np.errstate(divide="ignore", invalid="ignore"):
            se = np.sqrt(var / sxx * inflation)
        # Student's t on the effective sample size: the variance is estimated from only about
        # n_eff independent values.
        q = _t(params.level, np.maximum(nf / inflation - 2.0, 1.0))
        grows = slope - q * se > params.threshold_mb_h
        # Linear: neither half grows significantly slower than the other. A saturating curve
        # (a refill) slows down; a stretch holding a short rise and flat memory around it is
        # bent too: growth must be sustained over the whole stretch. Judged against the noise,
        # not the halves' residuals: a curve fitted by a line leaves large residuals, which
        # would hide the very bend the test looks for.
        mid = (a + b) // 2
        s1, _, x1, _ = self.sums.fit(a, mid)
        s2, _, x2, _ = self.sums.fit(mid, b)
        f = (1.0 + self.noise_rho) / (1.0 - self.noise_rho)
        with np.errstate(divide="ignore", invalid="ignore"):
            se_diff = np.sqrt(self.noise_var * (1.0 / x1 + 1.0 / x2) * f)
            bend = np.abs(s1 - s2) - _z_one_sided(params.level) * se_diff
        bent = bend > 1e-6 * np.maximum(np.abs(slope), 1.0)
        ok = grows & ~bent & np.isfinite(se)
        a, b, slope, se = a[ok], b[ok], slope[ok], se[ok]
        with np.errstate(divide="ignore"):
            strength = np.where(se > 0, (slope - params.threshold_mb_h) / se, np.inf)
        return Stretches(a, b, slope, se, strength)


def noise(blocks: np.ndarray) -> tuple[float, float]:
    """A series' noise from its stretches of ``sustain_s`` (rows of variance, rho_hat, bins,
    from every epoch's :meth:`_Epoch.noise_blocks`): the medians of their residual variances
    and of their bias-corrected lag-1 autocorrelations. Medians, because a stretch holding a
    refill or the bend of a leak fits a line poorly, and its residuals are larger and more
    correlated than the noise's; the series', not one epoch's, because a short epoch holds
    too few stretches."""
    if not len(blocks):
        return 0.0, 0.0
    var, rho_hat, n = blocks[:, 0], blocks[:, 1], blocks[:, 2]
    rho = np.clip((n * rho_hat + 2.0) / np.maximum(n - 6.0, 1.0), 0.0, MAX_RHO)
    return float(np.median(var)), float(np.median(rho))


@dataclass
class _EpochLeak:
    epoch: int
    hi: float
    rate: Slope
    count: int
    steepest: float
    ongoing: bool


def _components(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Indices of overlapping ``[a, b)`` ranges, grouped."""
    order = np.argsort(a, kind="stable")
    groups: list[list[int]] = []
    reach = -1
    for k in order:
        if groups and a[k] < reach:
            groups[-1].append(int(k))
            reach = max(reach, int(b[k]))
        else:
            groups.append([int(k)])
            reach = int(b[k])
    return [np.array(g) for g in groups]


CONFIRM = 5
"""Strongest stretches of a leak tried in turn for the Theil-Sen confirmation."""


class _SettledEpochs(NamedTuple):
    epochs: list[tuple[int, _Epoch, float]]
    """(index among the process lives, the epoch, where its settled part starts)."""
    noise_var: float
    noise_rho: float
    data_end: float


def _settled_epochs(
    t_s: Floats, values: Floats, restarts: Floats, params: LeakParams
) -> _SettledEpochs | None:
    """A series cut at its restarts into binned epochs of ``min_points`` bins, each given the
    series' noise (:func:`noise`) and started after its warm-up (``warmup_s``, then the
    data-driven refill test); epochs that never settle are left out. None without data."""
    order = np.argsort(np.asarray(t_s, dtype=float), kind="stable")
    t_all = np.asarray(t_s, dtype=float)[order]
    y_all = np.asarray(values, dtype=float)[order]
    if not len(t_all):
        return None
    data_end = float(t_all[-1]) + params.bin_s / 2.0
    epochs: list[tuple[int, _Epoch, float]] = []
    for k, (lo, hi, i, j) in enumerate(split_at(t_all, restarts)):
        tb, yb = binned(t_all[i:j], y_all[i:j], params.bin_s)
        if len(tb) < params.min_points:
            continue
        epoch = _Epoch(tb, yb, lo, hi, min(hi, data_end))
        start = max(lo + params.warmup_s, float(tb[0])) if math.isfinite(lo) else float(tb[0])
        if start < epoch.end:
            epochs.append((k, epoch, start))
    blocks = [e.noise_blocks(start, params) for _, e, start in epochs]
    noise_var, noise_rho = noise(np.concatenate(blocks) if blocks else np.zeros((0, 3)))
    settled: list[tuple[int, _Epoch, float]] = []
    for k, epoch, start in epochs:
        epoch.noise_var, epoch.noise_rho = noise_var, noise_rho
        if math.isfinite(epoch.lo):
            begin = epoch.settled(start, params)
            if begin is None:
                continue
            start = begin
        settled.append((k, epoch, start))
    return _SettledEpochs(settled, noise_var, noise_rho, data_end)


def find_leaks(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> list[Leak]:
    """Sustained leaks in one memory series (see the module docstring). ``restarts``: every
    process start known (a start before the first point only sets the first epoch's warm-up)."""
    if len(t_s) != len(values):
        raise ValueError(f"{len(t_s)} times but {len(values)} values")
    settled = _settled_epochs(t_s, values, restarts, params)
    if settled is None:
        return []
    noise_rho, data_end = settled.noise_rho, settled.data_end
    found: list[_EpochLeak] = []
    for k, epoch, start in settled.epochs:
        st = epoch.stretches(start, params)
        tb, yb = epoch.tb, epoch.yb
        for group in _components(st.a, st.b):
            a0, b0 = int(np.min(st.a[group])), int(np.max(st.b[group]))
            ramp = epoch.ramp(a0, b0, start, params)
            order = group[np.argsort(-st.strength[group], kind="stable")][:CONFIRM]
            tries = ([ramp] if ramp is not None else []) + [
                (int(st.a[g]), int(st.b[g])) for g in order
            ]
            for a, b in tries:
                rate = theil_sen(tb[a:b], yb[a:b], params.level, rho=noise_rho)
                if rate.low > params.threshold_mb_h:
                    steepest = float(np.max(st.slope[group]))
                    ongoing = b >= len(tb) and epoch.hi > data_end
                    found.append(_EpochLeak(k, epoch.hi, rate, len(group), steepest, ongoing))
                    break
    return _join_across_restarts(found, params)


def _join_across_restarts(found: list[_EpochLeak], params: LeakParams) -> list[Leak]:
    """Leaks of consecutive epochs, each one on its own, as one when only the restart between
    them interrupted the same growth (step 8 of the module docstring)."""
    gap = params.merge_gap_s if params.merge_gap_s is not None else params.sustain_s
    groups: list[list[_EpochLeak]] = []
    for leak in sorted(found, key=lambda f: f.rate.start):
        if groups:
            prev = groups[-1][-1]
            restart = prev.hi
            if (
                leak.epoch == prev.epoch + 1
                and restart - prev.rate.end <= gap
                and leak.rate.start - restart <= params.warmup_s + gap
                and leak.rate.low <= prev.rate.high
                and prev.rate.low <= leak.rate.high
            ):
                groups[-1].append(leak)
                continue
        groups.append([leak])
    out = []
    for group in groups:
        longest = max(group, key=lambda f: f.rate.end - f.rate.start)
        out.append(
            Leak(
                start=group[0].rate.start,
                end=group[-1].rate.end,
                rate=longest.rate,
                runs=[f.rate for f in group],
                stretches=sum(f.count for f in group),
                steepest_mb_h=max(f.steepest for f in group),
                ongoing=group[-1].ongoing,
            )
        )
    return out


def trend(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> Slope | None:
    """The slope over the longest piece between restarts (binned, warm-up left out), with the
    autocorrelation-widened interval: a series' overall memory trend, reported when no leak was
    found; None without enough points."""
    order = np.argsort(np.asarray(t_s, dtype=float), kind="stable")
    t_all = np.asarray(t_s, dtype=float)[order]
    y_all = np.asarray(values, dtype=float)[order]
    best: Slope | None = None
    for lo, _hi, i, j in split_at(t_all, restarts):
        a = i + int(np.searchsorted(t_all[i:j], lo + params.warmup_s)) if math.isfinite(lo) else i
        tb, yb = binned(t_all[a:j], y_all[a:j], params.bin_s)
        if len(tb) > TREND_POINTS:  # pairwise slopes are O(n^2): coarser bins for long pieces
            tb, yb = binned(tb, yb, (tb[-1] - tb[0]) / (TREND_POINTS - 1) + 1e-9)
        if len(tb) < params.min_points:
            continue
        s = theil_sen(tb, yb, params.level)
        if best is None or s.end - s.start > best.end - best.start:
            best = s
    return best


@dataclass(frozen=True)
class Growth:
    """A series' memory growth over every process life: the epochs' least-squares slopes (each
    after its warm-up, standard error widened for AR(1) noise) pooled by inverse variance."""

    mb_per_hour: float
    se: float
    """Standard error of the pooled slope (MB/hour), widened for autocorrelation."""
    n_eff: float
    """Effective number of independent bins behind it (sum over epochs of n (1 - rho) /
    (1 + rho))."""
    epochs: int
    hours: float
    """Hours of memory data the slope was fitted on (warm-ups left out)."""
    rho: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "mb_per_hour": self.mb_per_hour,
            "se": self.se,
            "n_eff": self.n_eff,
            "epochs": self.epochs,
            "hours": self.hours,
            "rho": self.rho,
        }


def growth(
    t_s: Floats,
    values: Floats,
    restarts: Floats = (),
    params: LeakParams = LeakParams(),
) -> Growth | None:
    """The series' growth over all its epochs (None without an epoch of ``min_points`` bins
    after its warm-up). Each epoch is cut and its warm-up skipped as :func:`find_leaks` does
    (``warmup_s``, then the data-driven refill test); its least-squares slope has the standard
    error sqrt(var / Sxx) x sqrt((1 + rho) / (1 - rho)) with the series' noise (variance and
    rho as in :func:`noise`, the epoch's own variance when larger); the epochs are pooled by
    inverse variance. A leak that grows through each process life raises it; saturating
    refills are left out; flat memory gives ~0 with a standard error that shrinks with the
    hours seen."""
    settled = _settled_epochs(t_s, values, restarts, params)
    if settled is None:
        return None
    noise_var, noise_rho = settled.noise_var, settled.noise_rho
    inflation = (1.0 + noise_rho) / (1.0 - noise_rho)
    slopes, variances, n_eff, hours = [], [], 0.0, 0.0
    for _k, epoch, start in settled.epochs:
        a = int(np.searchsorted(epoch.t_h, epoch.hours([start])[0], side="left"))
        b = len(epoch.t_h)
        if b - a < params.min_points:
            continue
        slope, var, sxx, _ = epoch.sums.fit(np.array([a]), np.array([b]))
        if not (sxx[0] > 0):
            continue
        v = max(float(var[0]), noise_var) / float(sxx[0]) * inflation
        if not v > 0:
            v = 1e-12
        slopes.append(float(slope[0]))
        variances.append(v)
        n_eff += (b - a) / inflation
        hours += float(epoch.t_h[b - 1] - epoch.t_h[a])
    if not slopes:
        return None
    w = 1.0 / np.asarray(variances)
    pooled = float(np.sum(w * np.asarray(slopes)) / np.sum(w))
    return Growth(pooled, float(math.sqrt(1.0 / np.sum(w))), n_eff, len(slopes), hours, noise_rho)


def excess_growth(
    candidate: Growth, incumbent: Growth, level: float = 0.95
) -> tuple[float, float, float]:
    """(candidate - incumbent slope, low, high): the difference of two independent pooled
    slopes, its standard error the root of the sum of their squares, the quantile Student's t
    on the smaller effective sample size less 2 (at least 1 degree of freedom)."""
    diff = candidate.mb_per_hour - incumbent.mb_per_hour
    se = math.hypot(candidate.se, incumbent.se)
    df = max(min(candidate.n_eff, incumbent.n_eff) - 2.0, 1.0)
    q = float(stats.t.ppf(1.0 - (1.0 - level) / 2.0, df))
    return diff, diff - q * se, diff + q * se
