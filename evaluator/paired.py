"""Paired intervals for the divergence excess: the candidate and the replay judged on the same
requests (triads: incumbent, candidate and replay answers to one request).

Pairing removes what the two shares have in common (the prompt mix of the day, long answers
that diverge more often on both sides), so the excess is estimated on the differences, not on
two independent samples. Pure functions; the level is whatever the caller hands in (the review
gives the sequential look's, :mod:`evaluator.sequential`).

- :func:`paired_share_difference`: the difference of two paired shares with Newcombe's interval
  for paired binary data (Newcombe 1998, "Improved confidence intervals for the difference
  between binomial proportions based on paired data", method 10: the two Wilson intervals
  combined with the phi correlation of the pairs);
- :func:`paired_mean_difference`: the mean of per-triad differences with a t interval.

Both widen their interval by the **design effect of UTC days** when the triads span at least
:data:`MIN_CLUSTERS` days: the variance of the mean difference estimated from per-day sums
(cluster-robust, CR1) over the variance that takes every triad as independent, when above 1.
Requests of one day share its traffic and the engines' state of that day; the day is the
cluster. *Assumes*: days independent. *Does not cover*: a drift over weeks.

Errors: none; no data gives None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from scipy import stats

from evaluator.rates import wilson_interval
from evaluator.results import Interval

MIN_CLUSTERS = 5
"""Fewest days for which the day design effect is estimated (fewer: pairs taken independent)."""


@dataclass(frozen=True)
class PairedEstimate:
    value: float
    interval: Interval | None
    n: int
    design_effect: float
    """Variance inflation applied for clustering by day (1: none)."""
    restate: Callable[[float], Interval | None] | None = field(default=None, compare=False)
    """The same interval at another level (``Measurement.restate``), when its method gives it."""


def design_effect(diffs: Sequence[float], clusters: Sequence[str]) -> float:
    """Cluster-robust (CR1) variance of the mean of ``diffs`` over its naive variance, at least
    1; 1 with fewer than :data:`MIN_CLUSTERS` clusters or no variance."""
    n = len(diffs)
    groups = sorted(set(clusters))
    g = len(groups)
    if g < MIN_CLUSTERS or n < 2:
        return 1.0
    d = np.asarray(diffs, dtype=float)
    mean = float(d.mean())
    naive = float(((d - mean) ** 2).sum())
    if naive <= 0:
        return 1.0
    index = {c: i for i, c in enumerate(groups)}
    idx = np.fromiter((index[c] for c in clusters), dtype=np.int64, count=n)
    sums = np.bincount(idx, weights=d - mean, minlength=g)
    robust = g / (g - 1) * float((sums**2).sum())
    return max(1.0, robust / naive)


def paired_share_difference(
    x: Sequence[bool], y: Sequence[bool], clusters: Sequence[str], level: float
) -> PairedEstimate | None:
    """``mean(x) - mean(y)`` for paired events (x: the candidate's, y: the replay's, on the
    same triads) with Newcombe's paired hybrid score interval at ``level``, widened by the day
    design effect. None without pairs."""
    n = len(x)
    if n == 0 or len(y) != n:
        return None
    a = sum(1 for u, v in zip(x, y, strict=True) if u and v)
    b = sum(1 for u, v in zip(x, y, strict=True) if u and not v)
    c = sum(1 for u, v in zip(x, y, strict=True) if v and not u)
    d = n - a - b - c
    deff = design_effect([float(u) - float(v) for u, v in zip(x, y, strict=True)], clusters)
    interval = newcombe_paired(a, b, c, d, deff, level)
    delta = (a + b) / n - (a + c) / n
    return PairedEstimate(delta, interval, n, deff, partial(newcombe_paired, a, b, c, d, deff))


def newcombe_paired(a: int, b: int, c: int, d: int, deff: float, level: float) -> Interval:
    """Newcombe's paired hybrid score interval (method 10) of ``(a + b) / n - (a + c) / n`` from
    the 2x2 counts of ``n`` pairs (a: both, b: first only, c: second only, d: neither) at
    ``level``, its half-widths widened by ``sqrt(deff)``."""
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    w1 = wilson_interval(a + b, n, level)
    w2 = wilson_interval(a + c, n, level)
    assert w1 is not None and w2 is not None
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    l1, u1 = p1 - w1.low, w1.high - p1
    l2, u2 = p2 - w2.low, w2.high - p2
    delta = p1 - p2
    lo_half = math.sqrt(max(0.0, l1**2 - 2 * phi * l1 * u2 + u2**2))
    hi_half = math.sqrt(max(0.0, u1**2 - 2 * phi * u1 * l2 + l2**2))
    s = math.sqrt(deff)
    return Interval(max(-1.0, delta - s * lo_half), min(1.0, delta + s * hi_half), level)


def paired_mean_difference(
    diffs: Sequence[float], clusters: Sequence[str], level: float
) -> PairedEstimate | None:
    """Mean of per-triad differences with a t interval at ``level`` (widened by the day design
    effect). None without data; no interval with fewer than 2 values."""
    n = len(diffs)
    if n == 0:
        return None
    arr = np.asarray(diffs, dtype=float)
    mean = float(arr.mean())
    if n < 2:
        return PairedEstimate(mean, None, n, 1.0)
    deff = design_effect(diffs, clusters)
    se = float(arr.std(ddof=1)) / math.sqrt(n) * math.sqrt(deff)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return PairedEstimate(mean, Interval(mean - half, mean + half, level), n, deff)
