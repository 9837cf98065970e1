"""The unit of independence of the latency intervals: hours and days, not pairs.

Requests of one hour share that hour's conditions (load, batch mix, the other tenants of the
GPU, an engine's own bad hour), and hours of one day share the day's; pairs are not independent
draws, and a bootstrap that resamples pairs takes ~10 000 correlated pairs for 10 000 independent
ones: its interval is far too narrow (an A/A month with engine-specific hour effects lands
outside it on most days). :func:`block_weights` resamples **whole blocks** instead, in two
stages (a two-stage cluster bootstrap): the days with replacement, then, within each drawn day,
its hours with replacement; a pair's weight in a resample is how often its hour was drawn. With
a single day it is the hour-block bootstrap. The two stages count the hour-to-hour variance a
second time inside the day-to-day one, so the interval is a little conservative (wider), never
narrower than either one-stage bootstrap on average.

What it assumes: hours of different days, and days, are independent of each other (a slow
drift over weeks is not covered); every pair's hour is known (the rollups store it).

Pure numpy; used by :mod:`evaluator.stats` (``blocks=`` of its comparisons).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

METHOD = "two-stage block bootstrap: UTC days resampled, then hours within each drawn day"
"""How the latency intervals resample (the method text of the report)."""
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
        """The blocks of items ``idx`` (a subsample), indexes made dense again."""
        return blocks_from_keys(
            [(int(self.day_of_hour[h]), int(h)) for h in self.hour_of[np.asarray(idx)]]
        )

    def describe(self) -> str:
        return f"{self.n_days} day(s), {self.n_hours} hour(s)"


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
    return blocks_from_keys([(h.date().isoformat(), h.isoformat()) for h in hours])


def block_weights(
    blocks: Blocks, n_resamples: int, rng: np.random.Generator, batch: int = 50
) -> Iterator[FloatArray]:
    """Batches of resample weights, each ``(b, len(blocks))``: item i's weight in a resample is
    how often its hour was drawn (days drawn with replacement, then hours within each drawn day
    with replacement)."""
    n_days, n_hours = blocks.n_days, blocks.n_hours
    hours_of_day = [np.flatnonzero(blocks.day_of_hour == d) for d in range(n_days)]
    done = 0
    while done < n_resamples:
        b = min(batch, n_resamples - done)
        hour_w = np.zeros((b, n_hours), dtype=np.float64)
        drawn = rng.integers(0, n_days, size=(b, n_days))
        for d in range(n_days):
            hs = hours_of_day[d]
            times = (drawn == d).sum(axis=1)  # how often day d was drawn in each resample
            for r in np.flatnonzero(times):
                pick = hs[rng.integers(0, hs.size, size=int(times[r]) * hs.size)]
                np.add.at(hour_w[r], pick, 1.0)
        yield hour_w[:, blocks.hour_of]
        done += b


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


def block_bootstrap(
    blocks: Blocks,
    statistic: Callable[[FloatArray], FloatArray],
    *,
    n_resamples: int,
    level: float,
    rng: np.random.Generator,
    batch: int = 50,
    point: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Percentile interval at ``level`` of ``statistic(weights (b, n)) -> (k, b)`` over block
    resamples: (low, high), each of length k. With ``point`` (the statistic as the caller
    computes it, e.g. interpolated quantiles) the interval is shifted by ``point`` minus the
    weighted statistic at unit weights, so both are computed alike (with few blocks, most
    resamples are the data itself)."""
    rows = [
        np.asarray(statistic(w), dtype=np.float64).T
        for w in block_weights(blocks, n_resamples, rng, batch)
    ]
    low, high = percentile_interval(np.concatenate(rows, axis=0), level)
    if point is not None:
        at_ones = np.asarray(statistic(np.ones((1, len(blocks)))), dtype=np.float64)[:, 0]
        shift = np.where(np.isfinite(at_ones) & np.isfinite(point), point - at_ones, 0.0)
        low, high = low + shift, high + shift
    return low, high
