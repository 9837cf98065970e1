"""Counts and rates of events, and exact comparisons of two rates: pure functions, no I/O.

- :func:`compare_poisson_rates`: two Poisson counts ``x1`` over exposure ``t1`` and ``x2`` over
  ``t2`` compared exactly by conditioning on the total: given ``n = x1 + x2``,
  ``x1 ~ Binomial(n, t1*r1 / (t1*r1 + t2*r2))``. Under equal rates the proportion is
  ``t1 / (t1 + t2)``, so the two-sided p-value is :func:`scipy.stats.binomtest`'s; the
  Clopper-Pearson interval ``(pl, pu)`` of the proportion becomes the rate-ratio interval
  ``(pl / (1 - pl) * t2 / t1, pu / (1 - pu) * t2 / t1)`` (Przyborowski & Wilenski 1940; the
  method of ``poisson.test`` in R). Sparse counts are fine: that is why it is exact.
- :func:`compare_failure_shares`: ``errors.rate_ratio``: failed exchanges are rare events over
  the exposure "exchanges sent", compared the same way (the conditional test is then the exact
  test of two rare proportions).
- :func:`bucket_start` / :func:`count_by_bucket`: UTC days and ISO weeks (Monday 00:00 UTC).
- :func:`compare_dispersed_rates`: the same on counts that are not Poisson (bursts, crash
  loops): the overdispersion factor phi estimated from per-day counts divides both counts, and,
  phi being an estimate on few days, the interval is Student's t on its degrees of freedom
  rather than the normal (quasi-Poisson's inference; :func:`quasi_tail`).
- :func:`wilson_interval`, :func:`newcombe_interval`: a share's score interval and the
  difference of two shares (Newcombe's hybrid score method 10), for the divergence rates.

Errors: ``ValueError`` for negative counts or non-positive exposures (a caller's bug).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import partial
from typing import Any, Literal

from scipy import stats

from evaluator.results import Interval, Measurement
from shadow_ab.timestamps import as_utc

By = Literal["day", "week"]
BUCKETS: tuple[By, ...] = ("day", "week")


@dataclass(frozen=True)
class RateComparison:
    """``x1 / t1`` against ``x2 / t2`` (side 1 = candidate, side 2 = incumbent by convention)."""

    x1: int
    t1: float
    x2: int
    t2: float
    ratio: float | None
    """(x1 / t1) / (x2 / t2); None when both counts are 0, inf when only x2 is 0."""
    interval: Interval
    """Exact conditional interval of the ratio; (0, inf) when both counts are 0."""
    p_value: float
    """Two-sided exact p-value of equal rates (1.0 when both counts are 0)."""
    dispersion: float = 1.0
    """Overdispersion factor the counts were divided by (1: Poisson counts; see
    :func:`compare_dispersed_rates`)."""
    dispersion_df: int = 0
    """Degrees of freedom ``dispersion`` was estimated on (per side with events, its days less
    one); the interval is then Student's t on them (:func:`quasi_tail`). 0: not estimated
    (Poisson counts, the exact interval as it is)."""

    def interval_at(self, level: float) -> Interval:
        """The ratio's interval at another ``level`` by the same exact method (the
        conditional binomial's beta quantiles, on the counts divided by ``dispersion``): what
        the verdict judges a PASS on at the look's PASS level (``Measurement.restate``). At
        zero or few events this is the exact bound, not a normal restatement of another
        level's. With an estimated dispersion, on its degrees of freedom (``dispersion_df``)."""
        if self.dispersion_df == 0 or self.x1 + self.x2 == 0:
            return compare_poisson_rates(self.x1, self.t1, self.x2, self.t2, level).interval
        return _dispersed_interval(
            self.x1, self.t1, self.x2, self.t2, self.dispersion, level, self.dispersion_df
        )

    def dispersion_note(self, counts: str = "per-day counts") -> str:
        """How the interval took the overdispersion, for a reason's text (empty for Poisson
        counts): phi and the degrees of freedom of its Student's t."""
        if self.dispersion_df == 0:
            return ""
        return (
            f", counts divided by the overdispersion {self.dispersion:.3g} of the {counts},"
            f" Student's t on its {self.dispersion_df} degrees of freedom"
        )

    @property
    def rate1(self) -> float:
        return self.x1 / self.t1

    @property
    def rate2(self) -> float:
        return self.x2 / self.t2

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON: an infinite ratio or upper bound is null (``unbounded`` says which)."""
        return {
            "x1": self.x1,
            "t1": self.t1,
            "x2": self.x2,
            "t2": self.t2,
            "rate1": self.rate1,
            "rate2": self.rate2,
            "ratio": finite_or_none(self.ratio),
            "interval": {
                "low": finite_or_none(self.interval.low),
                "high": finite_or_none(self.interval.high),
                "level": self.interval.level,
            },
            "unbounded": self.ratio is not None and math.isinf(self.ratio),
            "p_value": self.p_value,
            "dispersion": self.dispersion,
            "method": "exact conditional binomial (Clopper-Pearson)" + self.dispersion_note(),
            "dispersion_df": self.dispersion_df,
        }


def finite_or_none(x: float | None) -> float | None:
    """``x``, or None when it is None, infinite or NaN (strict JSON has no such numbers)."""
    return x if x is not None and math.isfinite(x) else None


def _check(x: int, t: float, name: str) -> None:
    if x < 0:
        raise ValueError(f"count {name} must be >= 0, got {x}")
    if not t > 0 or math.isinf(t):
        raise ValueError(f"exposure of {name} must be positive and finite, got {t}")


def compare_poisson_rates(
    x1: int, t1: float, x2: int, t2: float, level: float = 0.95
) -> RateComparison:
    """Exact comparison of two Poisson rates (see the module docstring)."""
    _check(x1, t1, "x1")
    _check(x2, t2, "x2")
    n = x1 + x2
    if n == 0:
        return RateComparison(x1, t1, x2, t2, None, Interval(0.0, math.inf, level), 1.0)
    p0 = t1 / (t1 + t2)
    test = stats.binomtest(x1, n, p0)
    pl, pu = clopper_pearson(x1, n, level)
    scale = t2 / t1
    low = _odds(pl) * scale
    high = _odds(pu) * scale
    ratio = math.inf if x2 == 0 else (x1 / t1) / (x2 / t2)
    return RateComparison(
        x1, t1, x2, t2, ratio, Interval(low, high, level), min(1.0, float(test.pvalue))
    )


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion ``k / n`` from beta
    quantiles: the same bounds as ``binomtest(...).proportion_ci(method="exact")``, without
    its root finding (a month of daily looks calls this thousands of times)."""
    a = 1.0 - level
    low = 0.0 if k == 0 else float(stats.beta.ppf(a / 2.0, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.isf(a / 2.0, k + 1, n - k))
    return low, high


def _odds(p: float) -> float:
    return math.inf if p >= 1.0 else p / (1.0 - p)


def compare_failure_shares(
    failed1: int, total1: int, failed2: int, total2: int, level: float = 0.95
) -> RateComparison | None:
    """``errors.rate_ratio``: failure share of side 1 over side 2, exact (rare-event)
    conditional test with the exchanges sent as exposures; None when a side sent nothing."""
    if total1 <= 0 or total2 <= 0:
        return None
    if not (0 <= failed1 <= total1 and 0 <= failed2 <= total2):
        raise ValueError(
            f"failures must be within 0..total: {failed1}/{total1}, {failed2}/{total2}"
        )
    return compare_poisson_rates(failed1, float(total1), failed2, float(total2), level)


def dispersion(
    counts: Sequence[Sequence[float]], exposures: Sequence[Sequence[float]]
) -> tuple[float, int]:
    """(phi, df): the overdispersion of event counts per bucket (day) against Poisson, pooled
    over the sides: Pearson's chi-square of each side's counts about its own constant rate, over
    its degrees of freedom ``df`` (quasi-Poisson's estimate), at least 1. ``counts[s][d]`` events
    of side ``s`` in bucket ``d`` with exposure ``exposures[s][d]`` (buckets with no exposure
    are skipped; a side without events or with one bucket adds no degree of freedom). Bursty
    failures and crash loops put many events on a few days: the factor is then the number of
    events a burst is worth as one independent event. (1.0, 0) when nothing can be estimated."""
    chi2, df = 0.0, 0
    for xs, ts in zip(counts, exposures, strict=True):
        pairs = [(float(x), float(t)) for x, t in zip(xs, ts, strict=True) if t > 0]
        total_x, total_t = sum(x for x, _ in pairs), sum(t for _, t in pairs)
        if total_x <= 0 or len(pairs) < 2:
            continue
        rate = total_x / total_t
        chi2 += sum((x - rate * t) ** 2 / (rate * t) for x, t in pairs)
        df += len(pairs) - 1
    return (max(1.0, chi2 / df), df) if df > 0 else (1.0, 0)


def quasi_tail(tail: float, df: int) -> float:
    """The normal tail whose quantile is Student's t quantile of one-sided ``tail`` on ``df``
    degrees of freedom: an interval computed at it is as much wider than at ``tail`` as t's is
    than the normal's (``df`` 0: ``tail`` itself). Quasi-Poisson's inference: with the
    overdispersion estimated from ``df`` degrees of freedom, the standardised ratio is t, not
    normal, and a phi estimated from few days is often too small (its chi-square spread)."""
    if df <= 0 or tail <= 0.0:
        return tail
    return float(stats.norm.sf(stats.t.isf(tail, df)))


def compare_dispersed_rates(
    x1_by: Sequence[float],
    t1_by: Sequence[float],
    x2_by: Sequence[float],
    t2_by: Sequence[float],
    level: float = 0.95,
) -> RateComparison:
    """:func:`compare_poisson_rates` for counts that are not Poisson (bursts, crash loops):
    per-bucket counts ``x*_by`` and exposures ``t*_by`` (side 1 = candidate); the overdispersion
    factor phi (:func:`dispersion`) divides both totals (a design effect: phi clustered events
    carry the information of one), and the conditional test runs on those effective counts
    (Clopper-Pearson bounds from the beta quantiles, which take non-whole counts) at the tail
    of Student's t on phi's degrees of freedom (:func:`quasi_tail`): phi is an estimate, and
    from few days an uncertain one. With one bucket (nothing to estimate phi on) it is exactly
    :func:`compare_poisson_rates`; with Poisson counts over many buckets it tends to it."""
    phi, df = dispersion([x1_by, x2_by], [t1_by, t2_by])
    x1, x2 = round(sum(x1_by)), round(sum(x2_by))
    t1, t2 = float(sum(t1_by)), float(sum(t2_by))
    plain = compare_poisson_rates(x1, t1, x2, t2, level)
    if df == 0 or x1 + x2 == 0:
        return plain
    e1, e2 = x1 / phi, x2 / phi
    p0 = t1 / (t1 + t2)
    n_eff = max(1, round(e1 + e2))
    p_value = float(stats.binomtest(min(n_eff, round(e1)), n_eff, p0).pvalue)
    return RateComparison(
        x1,
        t1,
        x2,
        t2,
        plain.ratio,
        _dispersed_interval(x1, t1, x2, t2, phi, level, df),
        min(1.0, p_value),
        phi,
        df,
    )


def _dispersed_interval(
    x1: int, t1: float, x2: int, t2: float, phi: float, level: float, df: int
) -> Interval:
    """The rate ratio's conditional-binomial interval on the effective counts ``x / phi``, each
    bound at the tail of Student's t on ``df`` (:func:`quasi_tail`)."""
    e1, e2 = x1 / phi, x2 / phi
    tail = quasi_tail((1.0 - level) / 2.0, df)
    with warnings.catch_warnings():
        # t on few df at an early look's level puts the tail far out (1e-100): scipy's beta
        # quantile may then warn that its root finding gave up and return a bound still beyond
        # any threshold (~1e-33), or NaN: that bound is the extreme one (0 or 1)
        warnings.simplefilter("ignore", RuntimeWarning)
        pl = float(stats.beta.ppf(tail, e1, e2 + 1)) if e1 > 0 else 0.0
        pu = float(stats.beta.isf(tail, e1 + 1, e2)) if e2 > 0 else 1.0
    pl, pu = (0.0 if math.isnan(pl) else pl), (1.0 if math.isnan(pu) else pu)
    scale = t2 / t1
    return Interval(_odds(pl) * scale, _odds(pu) * scale, level)


# -- buckets ------------------------------------------------------------------------------


def bucket_start(ts: datetime, by: By) -> datetime:
    """Start of the UTC day, or of the ISO week (Monday 00:00 UTC), that holds ``ts`` (naive =
    UTC)."""
    day: date = as_utc(ts).date()
    if by == "week":
        day = day - timedelta(days=day.weekday())
    elif by != "day":
        raise ValueError(f"bucket must be 'day' or 'week', got {by!r}")
    return datetime.combine(day, time.min, tzinfo=UTC)


def bucket_length(by: By) -> timedelta:
    return timedelta(days=7 if by == "week" else 1)


def bucket_label(start: datetime, by: By) -> str:
    if by == "week":
        year, week, _ = start.isocalendar()
        return f"{year}-W{week:02d}"
    return start.date().isoformat()


def buckets_between(start: datetime, end: datetime, by: By) -> list[datetime]:
    """Starts of every bucket that overlaps ``[start, end)``, in order."""
    out: list[datetime] = []
    b = bucket_start(start, by)
    step = bucket_length(by)
    end = as_utc(end)
    while b < end:
        out.append(b)
        b += step
    return out


def count_by_bucket(times: Iterable[datetime], by: By) -> dict[datetime, int]:
    """How many of ``times`` fall in each bucket (only buckets with at least one)."""
    return dict(sorted(Counter(bucket_start(t, by) for t in times).items()))


# -- shares -------------------------------------------------------------------------------


def wilson_interval(k: int, n: int, level: float = 0.95) -> Interval | None:
    """Wilson score interval of the share ``k / n`` (:func:`scipy.stats.binomtest`'s
    ``proportion_ci(method="wilson")``); None when ``n`` is 0."""
    if n <= 0:
        return None
    ci = stats.binomtest(k, n).proportion_ci(level, method="wilson")
    return Interval(float(ci.low), float(ci.high), level)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, level: float = 0.95) -> Interval | None:
    """Interval of ``k1/n1 - k2/n2`` by Newcombe's hybrid score method (his method 10, from
    the two Wilson intervals); None when either side has no data."""
    w1 = wilson_interval(k1, n1, level)
    w2 = wilson_interval(k2, n2, level)
    if w1 is None or w2 is None:
        return None
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    low = d - math.sqrt((p1 - w1.low) ** 2 + (w2.high - p2) ** 2)
    high = d + math.sqrt((w1.high - p1) ** 2 + (p2 - w2.low) ** 2)
    return Interval(max(-1.0, low), min(1.0, high), level)


# -- exposure -----------------------------------------------------------------------------


def observed_intervals(times: Iterable[float], max_gap_s: float) -> list[tuple[float, float]]:
    """The time an engine was watched, as merged ``(start, end)`` Unix-second intervals: its
    observations (health scrapes, requests) joined wherever consecutive ones are at most
    ``max_gap_s`` apart; a longer silence is time nobody was looking (not exposure)."""
    out: list[tuple[float, float]] = []
    for t in sorted(times):
        if out and t - out[-1][1] <= max_gap_s:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def overlap_s(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``intervals`` inside ``[start, end)``."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def poisson_rate_interval(x: int, t: float, level: float = 0.95) -> Interval:
    """Exact (Garwood) interval of the rate of ``x`` Poisson events over exposure ``t``: the
    chi-square quantiles ``chi2(a/2, 2x) / 2t .. chi2(1 - a/2, 2x + 2) / 2t``. With no event
    the upper bound is ``-ln(a/2) / t``: zero events over a short exposure bound nothing."""
    _check(x, t, "x")
    a = 1.0 - level
    low = 0.0 if x == 0 else float(stats.chi2.ppf(a / 2.0, 2 * x)) / (2.0 * t)
    high = float(stats.chi2.isf(a / 2.0, 2 * x + 2)) / (2.0 * t)
    return Interval(low, high, level)


def rate_measurement(
    key: str, x: int, t: float, level: float, unit: str, detail: str
) -> Measurement:
    """A rate ``x / t`` with its exact interval (:func:`poisson_rate_interval`), as a
    measurement; no value when nothing was observed (``t`` 0)."""
    if t <= 0:
        return Measurement(key, None, None, x, unit, detail + " (nothing observed)")
    return Measurement(
        key,
        x / t,
        poisson_rate_interval(x, t, level),
        x,
        unit,
        f"{x} events; {detail}",
        restate=partial(poisson_rate_interval, x, t),
    )
