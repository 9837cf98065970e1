"""The unit of independence of the latency intervals: hours and days, not pairs.

Requests of one hour share that hour's conditions (load, batch mix, the other tenants of the
GPU, an engine's own bad hour), and hours of one day share the day's; pairs are not independent
draws, and a bootstrap that resamples pairs takes ~10 000 correlated pairs for 10 000 independent
ones: its interval is far too narrow (an A/A month with engine-specific hour effects lands
outside it on most days). :func:`block_weights` resamples **whole blocks** instead; a pair's
weight in a resample is how often its hour was drawn:

- from :data:`MIN_DAYS` days of data on, **the days alone** (a cluster bootstrap at the top
  stage): ``n - 1`` of the ``n`` UTC days drawn with replacement, each drawn day whole, its
  hours and pairs as they are. Resampling a second stage (the hours within each drawn day)
  counts the hour-to-hour variance, and the pair-to-pair variance inside each hour mean, a
  second time: the day means' spread already holds it. Davison and Hinkley (1997, *Bootstrap
  Methods and their Application*, section 3.8, hierarchical data) show that resampling at both
  stages with replacement adds the within-cluster variance again, and that resampling the
  clusters and keeping each whole mimics the variance of the data (to order 1/clusters);
  Field and Welsh (2007, "Bootstrapping clustered data", JRSS B 69) find the cluster
  bootstrap's variance consistent as the clusters grow in number, under both their random
  effect and transformation models, where the two-stage one carries the extra within term.
  Drawing ``n - 1`` of ``n`` clusters rather than ``n`` is Rao and Wu's (1988, JASA 83)
  rescaling: the variance of a mean over the resamples is then unbiased, not low by
  ``(n - 1) / n`` (3 % at 30 days, 14 % at 7);
- with fewer days (a look in the first week), two stages: the days with replacement, then,
  within each drawn day, its hours with replacement. A few days are too few clusters to
  resample alone (one day: every resample is the data itself); the second stage gives the
  interval the hours' variety, and its double count makes it conservative (wider), never
  narrower than either one-stage bootstrap on average. Early looks' boundaries are far out
  (O'Brien-Fleming), so the extra width costs little power. With a single day it is the
  hour-block bootstrap.

What it assumes: days are independent of each other (a slow drift over weeks is not covered),
and, in the first week, hours of one day beyond their shared day effect; every pair's hour is
known (the rollups store it). With few days the day-to-day variance is estimated from few
clusters (7 days: 6 degrees of freedom): an interval's normal approximation at an early look's
extreme level is then too narrow when engine day effects dominate, which the sequential
boundary's margin covers in the month simulations (``bench/verdict_validity.py``).

numpy (scipy for the normal quantile); used by :mod:`evaluator.stats` (``blocks=`` of its
comparisons).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

METHOD = (
    "block bootstrap: whole UTC days resampled (n - 1 of n drawn) from 7 days of data on;"
    " before that two-stage, days then hours within each drawn day"
)
"""How the latency intervals resample (the method text of the report)."""
MIN_DAYS = 7
"""From this many days of data on, the days alone are resampled (see the module docstring);
with fewer, the days and then the hours within each drawn day."""
MIN_HOURS = 12
"""Fewer hours than this are too few blocks to resample (two hours give two resamples' worth
of variety): the intervals then resample pairs, and the method text says so."""


@dataclass(frozen=True)
class Blocks:
    """Which hour (and so which day) each item (pair) belongs to, as dense indexes."""

    hour_of: IntArray
    """Per item, its hour's index 0..n_hours-1."""
    day_of_hour: IntArray
    """Per hour, its day's index 0..n_days-1."""

    @property
    def n_hours(self) -> int:
        return int(self.day_of_hour.size)

    @property
    def n_days(self) -> int:
        return int(self.day_of_hour.max()) + 1 if self.day_of_hour.size else 0

    def __len__(self) -> int:
        return int(self.hour_of.size)

    def take(self, idx: IntArray) -> Blocks:
        """The blocks of items ``idx`` (a subsample), indexes made dense again (in the order
        :func:`blocks_from_keys` gives the keys ``(day index, hour index)``: by their text)."""
        sub = self.hour_of[np.asarray(idx, dtype=np.intp)]
        present = np.unique(sub)  # the old hours still holding items
        keys = sorted(
            ((int(self.day_of_hour[h]), int(h)) for h in present),
            key=lambda k: (str(k[0]), str(k[1])),
        )
        day_index = {d: i for i, d in enumerate(sorted({d for d, _ in keys}, key=str))}
        new_of_old = np.full(self.n_hours, -1, dtype=np.intp)
        new_of_old[np.array([h for _, h in keys], dtype=np.intp)] = np.arange(len(keys))
        day_of_hour = np.array([day_index[d] for d, _ in keys], dtype=np.intp)
        return Blocks(new_of_old[sub], day_of_hour)

    @property
    def days_only(self) -> bool:
        """Whether the resamples draw whole days alone (:data:`MIN_DAYS` days or more)."""
        return self.n_days >= MIN_DAYS

    def describe(self) -> str:
        how = "days resampled whole" if self.days_only else "days, then hours within them"
        return f"{self.n_days} day(s), {self.n_hours} hour(s): {how}"


def blocks_from_keys(keys: Sequence[tuple[object, object]]) -> Blocks:
    """Blocks from a (day key, hour key) per item (any hashable, orderable keys)."""
    hours = sorted(set(keys), key=lambda k: (str(k[0]), str(k[1])))
    hour_index = {k: i for i, k in enumerate(hours)}
    days = sorted({d for d, _ in hours}, key=str)
    day_index = {d: i for i, d in enumerate(days)}
    hour_of = np.array([hour_index[k] for k in keys], dtype=np.intp)
    day_of_hour = np.array([day_index[d] for d, _ in hours], dtype=np.intp)
    return Blocks(hour_of, day_of_hour)


def blocks_from_hours(hours: Sequence[datetime]) -> Blocks:
    """Blocks of items from each item's UTC hour (a datetime truncated to the hour)."""
    keys: dict[datetime, tuple[str, str]] = {}
    for h in set(hours):  # each distinct hour's keys once (a month's sample: 40 000 items)
        keys[h] = (h.date().isoformat(), h.isoformat())
    return blocks_from_keys([keys[h] for h in hours])


def block_weights(
    blocks: Blocks, n_resamples: int, rng: np.random.Generator, batch: int = 50
) -> Iterator[FloatArray]:
    """Batches of resample weights, each ``(b, len(blocks))``: item i's weight in a resample is
    how often its hour was drawn (from :data:`MIN_DAYS` days on, ``n - 1`` of the ``n`` days
    drawn with replacement, each whole; before, the days with replacement, then the hours
    within each drawn day with replacement)."""
    for hour_w in hour_weights(blocks, n_resamples, rng, batch):
        yield hour_w[:, blocks.hour_of]


def hour_weights(
    blocks: Blocks,
    n_resamples: int,
    rng: np.random.Generator,
    batch: int = 50,
    *,
    days_only: bool | None = None,
) -> Iterator[FloatArray]:
    """:func:`block_weights` per hour rather than per item: batches ``(b, n_hours)`` of how often
    each hour was drawn (vectorized: every drawn day's hours drawn at once). ``days_only``:
    force the days-alone (True) or the two-stage (False) scheme, else by :data:`MIN_DAYS`."""
    whole_days = blocks.days_only if days_only is None else (days_only and blocks.n_days >= 2)
    if whole_days:
        yield from _day_weights(blocks, n_resamples, rng, batch)
        return
    n_days, n_hours = blocks.n_days, blocks.n_hours
    by_day = np.argsort(blocks.day_of_hour, kind="stable")  # hours grouped by day
    per_day = np.bincount(blocks.day_of_hour, minlength=n_days)
    first = np.concatenate([[0], np.cumsum(per_day)[:-1]])
    done = 0
    while done < n_resamples:
        b = min(batch, n_resamples - done)
        drawn = rng.integers(0, n_days, size=(b, n_days)).ravel()
        sizes = per_day[drawn]
        day = np.repeat(drawn, sizes)
        slot = (rng.random(day.size) * per_day[day]).astype(np.intp)
        hour = by_day[first[day] + np.minimum(slot, per_day[day] - 1)]
        row = np.repeat(np.repeat(np.arange(b), n_days), sizes)
        counts = np.bincount(row * n_hours + hour, minlength=b * n_hours)
        yield counts.reshape(b, n_hours).astype(np.float64)
        done += b


def _day_weights(
    blocks: Blocks, n_resamples: int, rng: np.random.Generator, batch: int
) -> Iterator[FloatArray]:
    """Whole days: ``n - 1`` of the ``n`` days drawn with replacement per resample (Rao and
    Wu's rescaling), each hour weighted by how often its day was drawn."""
    for day_w in _day_counts(blocks, n_resamples, rng, batch):
        yield day_w[:, blocks.day_of_hour]


def _day_counts(
    blocks: Blocks, n_resamples: int, rng: np.random.Generator, batch: int
) -> Iterator[FloatArray]:
    """:func:`_day_weights` per day: batches ``(b, n_days)`` of how often each day was drawn."""
    n_days = blocks.n_days
    done = 0
    while done < n_resamples:
        b = min(batch, n_resamples - done)
        drawn = rng.integers(0, n_days, size=(b, n_days - 1))
        rows = np.repeat(np.arange(b), n_days - 1)
        counts = np.bincount(rows * n_days + drawn.ravel(), minlength=b * n_days)
        yield counts.reshape(b, n_days).astype(np.float64)
        done += b


def resample_units(blocks: Blocks) -> tuple[IntArray, int]:
    """What a resample gives one weight to: (each item's unit, the number of units). The days
    when days are resampled whole (:data:`MIN_DAYS` days or more), else the hours. An item's
    weight in a resample is its unit's weight in :func:`unit_weights`."""
    if blocks.days_only:
        return blocks.day_of_hour[blocks.hour_of], blocks.n_days
    return blocks.hour_of, blocks.n_hours


def unit_weights(
    blocks: Blocks, n_resamples: int, rng: np.random.Generator, batch: int = 50
) -> Iterator[FloatArray]:
    """:func:`hour_weights` per unit of :func:`resample_units`: batches ``(b, n_days)`` when
    days are resampled whole, else ``(b, n_hours)``; the same draws from ``rng`` (a day's
    hours all carry its weight, so nothing is lost by not repeating it for each hour)."""
    if blocks.days_only:
        yield from _day_counts(blocks, n_resamples, rng, batch)
    else:
        yield from hour_weights(blocks, n_resamples, rng, batch)


class GroupedQuantiles:
    """Inverted-CDF quantiles ``qs`` of fixed ``values`` under many rows of weights given per
    group (item i weighs ``w[:, group_of[i]]``), computed without expanding the weights to
    every item: the values are sorted and each group's running counts on a coarse grid of the
    sorted positions are computed once (``__init__``), so a batch of weights costs one small
    matrix product (the weighted CDF on the grid) and a refinement within the bracket of each
    row. Exact: the same positions as :func:`weighted_quantiles_rows` of the expanded weights
    (integer weights and counts add up exactly in float64), whatever the grid's ``step``."""

    def __init__(
        self,
        values: FloatArray,
        group_of: IntArray,
        n_groups: int,
        qs: Sequence[float],
        step: int | None = None,
    ) -> None:
        order = np.argsort(values, kind="stable")
        self.v = values[order]
        self.g = np.asarray(group_of)[order]
        self.qs = tuple(qs)
        n = self.v.size
        if step is None:
            # the grid product costs b * n_groups * n / step multiply-adds, the refinement
            # b * step * len(qs) gathers, each ~16 times as costly: measured best near this
            step = int(min(4096, max(64, math.sqrt(n_groups * n / (16 * max(1, len(qs)))))))
        self.step = step
        # grid point k is sorted position min(step (k + 1) - 1, n - 1): the CDF is computed there
        self.grid = np.minimum(np.arange(step - 1, n + step - 1, step), n - 1)
        in_bucket = np.bincount(
            self.g * self.grid.size + np.arange(n) // step, minlength=n_groups * self.grid.size
        ).reshape(n_groups, self.grid.size)
        self.running = np.cumsum(in_bucket, axis=1).astype(np.float64)  # items <= each point

    def __call__(self, w: FloatArray) -> FloatArray:
        """The quantiles under each row of group weights ``w`` (b, n_groups): ``(len(qs), b)``,
        NaN for a row of zero weight."""
        v, g, grid, step = self.v, self.g, self.grid, self.step
        n, b = v.size, w.shape[0]
        out = np.full((len(self.qs), b), np.nan)
        if n == 0:
            return out
        # (b, grid); einsum rather than a BLAS product: this small product, run on a busy
        # machine's threaded BLAS, took 10x longer than in one thread
        cdf = np.einsum("bh,hg->bg", w, self.running, optimize=False)
        total = cdf[:, -1]
        rows = np.arange(b)
        span = np.arange(step)
        for i, q in enumerate(self.qs):
            target = q * total
            k = (cdf < target[:, None]).sum(axis=1)  # first grid point reaching the target
            k = np.minimum(k, grid.size - 1)
            lo = np.where(k > 0, grid[np.maximum(k - 1, 0)] + 1, 0)  # the bracket's first
            base = np.where(k > 0, cdf[rows, np.maximum(k - 1, 0)], 0.0)
            pos = np.minimum(lo[:, None] + span[None, :], n - 1)  # (b, step)
            cum = base[:, None] + np.cumsum(w[rows[:, None], g[pos]], axis=1)
            j = (cum < target[:, None]).sum(axis=1)
            out[i] = v[np.minimum(lo + j, n - 1)]
        out[:, total <= 0] = np.nan
        return out


def hour_weighted_quantiles(
    values: FloatArray,
    blocks: Blocks,
    hour_w: FloatArray,
    qs: Sequence[float],
    step: int | None = None,
) -> FloatArray:
    """:func:`weighted_quantiles_rows` of ``values`` under item weights
    ``hour_w[:, blocks.hour_of]``, without expanding them (:class:`GroupedQuantiles` with the
    hours as groups: the same inverted-CDF quantiles, a few times faster for thousands of
    items); ``(len(qs), b)``. To apply many batches of weights to the same values, build the
    :class:`GroupedQuantiles` once."""
    return GroupedQuantiles(values, blocks.hour_of, blocks.n_hours, qs, step)(hour_w)


def weighted_quantiles_rows(
    values: FloatArray, weights: FloatArray, qs: Sequence[float]
) -> FloatArray:
    """Per row of ``weights`` (b, n), the inverted-CDF quantiles ``qs`` of ``values`` (n,)
    weighted by that row: ``(len(qs), b)``. NaN for a row of zero weight."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    cum = np.cumsum(weights[:, order], axis=1)
    total = cum[:, -1] if cum.shape[1] else np.zeros(weights.shape[0])
    out = np.empty((len(qs), weights.shape[0]), dtype=np.float64)
    for i, q in enumerate(qs):
        target = q * total
        idx = (cum < target[:, None]).sum(axis=1)
        out[i] = v[np.minimum(idx, v.size - 1)] if v.size else np.nan
    out[:, total <= 0] = np.nan
    return out


MIN_TAIL = 4
"""A percentile bound needs at least this many resamples beyond it: a percentile bootstrap of B
resamples cannot place a bound further out than its few most extreme resamples (999 resamples
hold 2.5 beyond a 99.5 % interval's bound, none beyond the 1 - 1e-6 an early look of the
sequential plan asks for: it returns its widest resamples, an interval far too narrow), so past
``MIN_TAIL / B`` in each tail :func:`bootstrap_interval` uses the normal approximation with the
resamples' standard deviation (999 resamples: beyond 99.2 %; 199: beyond 96 %)."""


def percentile_interval(stats: FloatArray, level: float) -> tuple[FloatArray, FloatArray]:
    """Percentile interval at ``level`` of resampled statistics ``(n_resamples, k)``, per column
    (NaN resamples ignored; NaN when every one is NaN)."""
    alpha = 1.0 - level
    with np.errstate(all="ignore"):
        finite = np.where(np.isfinite(stats), stats, np.nan)
        if not np.isfinite(finite).any():
            nan = np.full(stats.shape[1], np.nan)
            return nan, nan.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            low = np.nanquantile(finite, alpha / 2, axis=0)
            high = np.nanquantile(finite, 1 - alpha / 2, axis=0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def normal_interval(
    stats: FloatArray, level: float, center: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``center`` plus or minus z(level) standard deviations of the resampled statistics
    ``(n_resamples, k)``, per column: on the log scale when the column's center and every
    finite resample are positive (ratios), else on the statistic's own scale."""
    z = float(norm.isf((1.0 - level) / 2.0))
    low = np.full(stats.shape[1], np.nan)
    high = np.full(stats.shape[1], np.nan)
    for j in range(stats.shape[1]):
        col = stats[:, j][np.isfinite(stats[:, j])]
        c = float(center[j])
        if col.size < 2 or not math.isfinite(c):
            continue
        if c > 0 and bool(np.all(col > 0)):
            sd = float(np.std(np.log(col), ddof=1))
            low[j], high[j] = c * math.exp(-z * sd), c * math.exp(z * sd)
        else:
            sd = float(np.std(col, ddof=1))
            low[j], high[j] = c - z * sd, c + z * sd
    return low, high


def resolvable(level: float, n_resamples: int) -> bool:
    """Whether ``n_resamples`` resamples hold at least :data:`MIN_TAIL` beyond each bound of a
    ``level`` percentile interval."""
    return (1.0 - level) / 2.0 * n_resamples >= MIN_TAIL


def bootstrap_interval(
    stats: FloatArray, level: float, center: FloatArray
) -> tuple[FloatArray, FloatArray, str]:
    """The interval at ``level`` from resampled statistics ``(n_resamples, k)`` whose estimate is
    ``center`` (k,): the percentile interval when ``n_resamples`` resolve ``level``
    (:func:`resolvable`), else the normal approximation about ``center``
    (:func:`normal_interval`). The third item names the method used ("percentile" or
    "normal")."""
    if resolvable(level, stats.shape[0]):
        low, high = percentile_interval(stats, level)
        return low, high, "percentile"
    low, high = normal_interval(stats, level, center)
    return low, high, "normal"


def block_bootstrap(
    blocks: Blocks,
    statistic: Callable[[FloatArray], FloatArray],
    *,
    n_resamples: int,
    level: float,
    rng: np.random.Generator,
    batch: int = 50,
    point: FloatArray | None = None,
    per_hour: bool = False,
    per_unit: bool = False,
) -> tuple[FloatArray, FloatArray]:
    """Interval at ``level`` of ``statistic(weights (b, n)) -> (k, b)`` over block resamples:
    (low, high), each of length k; percentile, or the normal approximation beyond what
    ``n_resamples`` resolve (:func:`bootstrap_interval`). With ``point`` (the statistic as the
    caller computes it, e.g. interpolated quantiles) the interval is shifted by ``point`` minus
    the weighted statistic at unit weights, so both are computed alike (with few blocks, most
    resamples are the data itself). ``per_hour``: ``statistic`` takes the hour weights
    ``(b, n_hours)`` instead (the same resamples, never expanded to every item: for statistics
    such as :func:`hour_weighted_quantiles`). ``per_unit``: it takes the weights of the units
    of :func:`resample_units` instead (days when days are resampled whole, else hours: the
    same resamples again, for :class:`GroupedQuantiles` over those units)."""
    if per_unit:
        reps = np.concatenate(
            [
                np.asarray(statistic(w), dtype=np.float64).T
                for w in unit_weights(blocks, n_resamples, rng, batch)
            ],
            axis=0,
        )
        n_units = resample_units(blocks)[1]
        at_ones = np.asarray(statistic(np.ones((1, n_units))), dtype=np.float64)[:, 0]
        return shifted_interval(reps, level, at_ones, point)
    stat = statistic if per_hour else (lambda hw: statistic(hw[:, blocks.hour_of]))
    reps = np.concatenate(
        [
            np.asarray(stat(hw), dtype=np.float64).T
            for hw in hour_weights(blocks, n_resamples, rng, batch)
        ],
        axis=0,
    )
    at_ones = np.asarray(stat(np.ones((1, blocks.n_hours))), dtype=np.float64)[:, 0]
    return shifted_interval(reps, level, at_ones, point)


def shifted_interval(
    reps: FloatArray, level: float, at_ones: FloatArray, point: FloatArray | None
) -> tuple[FloatArray, FloatArray]:
    """:func:`bootstrap_interval` of resamples ``reps`` whose statistic at unit weights is
    ``at_ones``, moved onto ``point`` (when given): a percentile interval is shifted by
    ``point - at_ones``, a normal one is centred on ``point``."""
    target = at_ones if point is None else np.asarray(point, dtype=np.float64)
    center = np.where(np.isfinite(target), target, at_ones)
    low, high, method = bootstrap_interval(reps, level, center)
    if method == "percentile" and point is not None:
        shift = np.where(np.isfinite(at_ones) & np.isfinite(point), point - at_ones, 0.0)
        low, high = low + shift, high + shift
    return low, high
