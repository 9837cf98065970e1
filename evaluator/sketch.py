"""A mergeable log-bucketed histogram sketch (DDSketch-like) for latency quantiles.

A value ``x > 0`` goes to bucket ``i = floor(ln(x) / ln(gamma))``, covering
``[gamma^i, gamma^(i+1))``, with ``gamma = (1 + a) / (1 - a)`` for a relative accuracy ``a``
(1 % by default). The bucket's representative value ``2 gamma^(i+1) / (gamma + 1)`` is within
``a`` of every value in the bucket, so any quantile read from the sketch is within ``a``
(relative) of the exact order statistic at the same rank (Masson, Rim and Lee, "DDSketch",
VLDB 2019). Values ``<= 0`` are counted in ``zero_count`` and read back as 0.

Sketches merge (and subtract) by adding bucket counts, so hourly sketches stored by
:mod:`evaluator.rollups` add up to days, weeks and whole windows without the raw values; the
bucket index is computed in SQL with the same formula (``floor(ln(x) / ln(gamma))``).

Errors: ``ValueError`` for sketches of different accuracy, or a subtraction below zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

RELATIVE_ACCURACY = 0.01
IntArray = npt.NDArray[np.int64]


def gamma_for(relative_accuracy: float) -> float:
    if not 0 < relative_accuracy < 1:
        raise ValueError(f"relative accuracy must be in (0, 1), got {relative_accuracy}")
    return (1 + relative_accuracy) / (1 - relative_accuracy)


GAMMA = gamma_for(RELATIVE_ACCURACY)
LN_GAMMA = math.log(GAMMA)


def bucket_index(values: npt.ArrayLike, relative_accuracy: float = RELATIVE_ACCURACY) -> IntArray:
    """Bucket indexes of positive values (the SQL in evaluator/rollups.py computes the same)."""
    ln_gamma = math.log(gamma_for(relative_accuracy))
    arr = np.asarray(values, dtype=np.float64)
    return np.floor(np.log(arr) / ln_gamma).astype(np.int64)


def _aggregate(keys: IntArray, counts: IntArray) -> tuple[IntArray, IntArray]:
    """Sorted unique keys with summed counts (zero counts dropped)."""
    if keys.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    summed = np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)
    nonzero = summed != 0
    return uniq[nonzero].astype(np.int64), summed[nonzero]


@dataclass
class LogSketch:
    """Bucket counts of a set of values: ``keys`` (sorted bucket indexes) and their ``counts``,
    plus count, zero count, sum, min and max."""

    relative_accuracy: float = RELATIVE_ACCURACY
    keys: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    counts: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    zero_count: int = 0
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @property
    def gamma(self) -> float:
        return gamma_for(self.relative_accuracy)

    @property
    def count(self) -> int:
        return int(self.counts.sum()) + self.zero_count

    @property
    def mean(self) -> float:
        n = self.count
        return self.sum / n if n else math.nan

    @classmethod
    def of(cls, values: npt.ArrayLike, relative_accuracy: float = RELATIVE_ACCURACY) -> LogSketch:
        """A sketch of ``values`` (NaN and inf are ignored)."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        arr = arr[np.isfinite(arr)]
        positive = arr[arr > 0]
        keys, counts = _aggregate(
            bucket_index(positive, relative_accuracy), np.ones(positive.size, np.int64)
        )
        return cls(
            relative_accuracy,
            keys,
            counts,
            zero_count=int(arr.size - positive.size),
            sum=float(arr.sum()),
            min=float(arr.min()) if arr.size else math.inf,
            max=float(arr.max()) if arr.size else -math.inf,
        )

    @classmethod
    def from_parts(
        cls,
        keys: Iterable[npt.ArrayLike],
        counts: Iterable[npt.ArrayLike],
        *,
        zero_count: int = 0,
        sum: float = 0.0,
        min: float | None = None,
        max: float | None = None,
        relative_accuracy: float = RELATIVE_ACCURACY,
    ) -> LogSketch:
        """One sketch from many stored sparse (keys, counts) lists at once: the fast way to merge
        thousands of rollup rows (one numpy aggregation instead of a merge per row)."""
        key_parts = [np.asarray(k, dtype=np.int64) for k in keys]
        count_parts = [np.asarray(c, dtype=np.int64) for c in counts]
        all_keys = np.concatenate(key_parts) if key_parts else np.empty(0, np.int64)
        all_counts = np.concatenate(count_parts) if count_parts else np.empty(0, np.int64)
        if all_keys.shape != all_counts.shape:
            raise ValueError("sketch parts: keys and counts differ in length")
        k, c = _aggregate(all_keys, all_counts)
        return cls(
            relative_accuracy,
            k,
            c,
            zero_count=int(zero_count),
            sum=float(sum),
            min=math.inf if min is None else float(min),
            max=-math.inf if max is None else float(max),
        )

    def _check(self, other: LogSketch) -> None:
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError(
                f"cannot combine sketches of accuracy {self.relative_accuracy}"
                f" and {other.relative_accuracy}"
            )

    def merge(self, other: LogSketch) -> LogSketch:
        """A new sketch of both sets of values."""
        self._check(other)
        keys, counts = _aggregate(
            np.concatenate([self.keys, other.keys]), np.concatenate([self.counts, other.counts])
        )
        return LogSketch(
            self.relative_accuracy,
            keys,
            counts,
            self.zero_count + other.zero_count,
            self.sum + other.sum,
            min(self.min, other.min),
            max(self.max, other.max),
        )

    def subtract(self, other: LogSketch) -> LogSketch:
        """A new sketch without ``other``'s values (which must have been merged in). Min and max
        stay those of the larger set (a bound, not exact)."""
        self._check(other)
        keys, counts = _aggregate(
            np.concatenate([self.keys, other.keys]), np.concatenate([self.counts, -other.counts])
        )
        zero = self.zero_count - other.zero_count
        if (counts < 0).any() or zero < 0:
            raise ValueError("subtracting a sketch that was not merged in")
        return LogSketch(
            self.relative_accuracy, keys, counts, zero, self.sum - other.sum, self.min, self.max
        )

    def value_of(self, keys: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Representative values of bucket indexes: within the relative accuracy of any value
        in the bucket."""
        g = self.gamma
        return np.asarray(2.0 * np.power(g, np.asarray(keys, dtype=np.float64) + 1) / (g + 1))

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Quantile estimates: the value at rank ``floor(q * (count - 1))`` (0-based) of the
        sorted values, within the relative accuracy; NaN for an empty sketch."""
        n = self.count
        if n == 0:
            return [math.nan] * len(qs)
        cum = np.cumsum(self.counts)
        out = []
        for q in qs:
            if not 0 <= q <= 1:
                raise ValueError(f"quantile {q} outside [0, 1]")
            rank = math.floor(q * (n - 1))
            if rank < self.zero_count:
                out.append(0.0)
                continue
            i = int(np.searchsorted(cum, rank - self.zero_count, side="right"))
            value = float(self.value_of(self.keys[i]))
            if self.min <= self.max:  # clamp to the observed range when known
                value = min(max(value, self.min), self.max)
            out.append(value)
        return out

    def quantile(self, q: float) -> float:
        return self.quantiles([q])[0]

    def cdf_points(self, max_points: int = 200) -> tuple[list[float], list[float]]:
        """(values, probs): the empirical CDF at the buckets' representative values, at most
        ``max_points`` points (evenly spaced in probability), for plotting."""
        n = self.count
        if n == 0:
            return [], []
        values = self.value_of(self.keys)
        probs = (np.cumsum(self.counts) + self.zero_count) / n
        if self.zero_count:
            values = np.concatenate([[0.0], values])
            probs = np.concatenate([[self.zero_count / n], probs])
        if values.size > max_points:
            pick = np.unique(
                np.searchsorted(probs, np.linspace(0, 1, max_points), side="left").clip(
                    0, values.size - 1
                )
            )
            values, probs = values[pick], probs[pick]
        return [float(v) for v in values], [float(p) for p in probs]

    def to_dict(self) -> dict[str, object]:
        return {
            "relative_accuracy": self.relative_accuracy,
            "keys": [int(k) for k in self.keys],
            "counts": [int(c) for c in self.counts],
            "zero_count": self.zero_count,
            "sum": self.sum,
            "min": self.min if self.min <= self.max else None,
            "max": self.max if self.min <= self.max else None,
        }
