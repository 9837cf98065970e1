"""Exact rate comparisons, share intervals, buckets and exposure: known published values."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from scipy import stats

from evaluator.rates import (
    bucket_label,
    bucket_start,
    buckets_between,
    compare_failure_shares,
    compare_poisson_rates,
    count_by_bucket,
    newcombe_interval,
    observed_intervals,
    overlap_s,
    wilson_interval,
)


def test_textbook_example_matches_r_poisson_test() -> None:
    # R's ?poisson.test example (eba1977, Fredericia vs the other three cities, ages 55-59):
    # poisson.test(c(11, 6+8+7), c(800, 1083+1050+878)) -> rate ratio 1.971488,
    # 95% CI 0.8584264 .. 4.2772659, p-value 0.07967.
    r = compare_poisson_rates(11, 800, 21, 1083 + 1050 + 878)
    assert r.ratio == pytest.approx(1.971488, abs=1e-6)
    assert r.interval.low == pytest.approx(0.8584264, abs=1e-6)
    assert r.interval.high == pytest.approx(4.2772659, abs=1e-6)
    assert r.p_value == pytest.approx(0.07967, abs=1e-5)


@pytest.mark.parametrize(
    ("x1", "t1", "x2", "t2"), [(3, 10.0, 12, 10.0), (7, 2.5, 1, 9.0), (0, 4.0, 5, 4.0)]
)
def test_conditional_binomial_against_scipy(x1: int, t1: float, x2: int, t2: float) -> None:
    r = compare_poisson_rates(x1, t1, x2, t2)
    n, p0 = x1 + x2, t1 / (t1 + t2)
    assert r.p_value == pytest.approx(stats.binomtest(x1, n, p0).pvalue)
    # Clopper-Pearson from beta quantiles, then odds times t2/t1.
    lo = 0.0 if x1 == 0 else stats.beta.ppf(0.025, x1, n - x1 + 1)
    hi = 1.0 if x1 == n else stats.beta.ppf(0.975, x1 + 1, n - x1)
    assert r.interval.low == pytest.approx(lo / (1 - lo) * t2 / t1)
    expected_hi = math.inf if hi >= 1 else hi / (1 - hi) * t2 / t1
    assert r.interval.high == pytest.approx(expected_hi)
    assert r.interval.contains(r.ratio if r.ratio is not None else 1.0)


def test_equal_rates_and_empty_counts() -> None:
    same = compare_poisson_rates(5, 1.0, 5, 1.0)
    assert same.ratio == 1.0 and same.p_value == pytest.approx(1.0)
    none = compare_poisson_rates(0, 1.0, 0, 1.0)
    assert none.ratio is None and none.interval.low == 0 and math.isinf(none.interval.high)
    only_candidate = compare_poisson_rates(4, 1.0, 0, 1.0)
    assert only_candidate.ratio == math.inf and only_candidate.interval.low > 0
    d = only_candidate.to_dict()
    assert d["ratio"] is None and d["unbounded"] and d["interval"]["high"] is None
    with pytest.raises(ValueError, match="exposure"):
        compare_poisson_rates(1, 0.0, 1, 1.0)


def test_failure_shares_sparse_counts() -> None:
    r = compare_failure_shares(6, 1000, 1, 1000)
    assert r is not None and r.ratio == pytest.approx(6.0)
    assert r.interval.low < 1 < r.interval.high  # 6 vs 1 is not conclusive
    assert compare_failure_shares(1, 0, 0, 10) is None
    strong = compare_failure_shares(60, 1000, 2, 1000)
    assert strong is not None and strong.interval.low > 1 and strong.p_value < 1e-10


def test_wilson_interval() -> None:
    none = wilson_interval(0, 100)
    assert (
        none is not None and none.low == pytest.approx(0.0, abs=1e-12) and 0.03 < none.high < 0.04
    )
    half = wilson_interval(50, 100)
    assert half is not None and half.low < 0.5 < half.high
    assert wilson_interval(0, 0) is None


def test_wilson_and_newcombe_published_values() -> None:
    # Newcombe (1998), Stat Med 17:857 and 17:873: 81/263 -> 0.2553 .. 0.3662;
    # 56/70 - 48/80 -> 0.0524 .. 0.3339 and 9/10 - 3/10 -> 0.1705 .. 0.8090 (method 10).
    w = wilson_interval(81, 263)
    assert w is not None and (round(w.low, 4), round(w.high, 4)) == (0.2553, 0.3662)
    d = newcombe_interval(56, 70, 48, 80)
    assert d is not None and (round(d.low, 4), round(d.high, 4)) == (0.0524, 0.3339)
    d2 = newcombe_interval(9, 10, 3, 10)
    assert d2 is not None and (round(d2.low, 4), round(d2.high, 4)) == (0.1705, 0.8090)
    assert wilson_interval(0, 0) is None and newcombe_interval(1, 2, 0, 0) is None


def test_buckets_days_and_iso_weeks() -> None:
    wed = datetime(2026, 12, 2, 15, 30, tzinfo=UTC)
    assert bucket_start(wed, "day") == datetime(2026, 12, 2, tzinfo=UTC)
    assert bucket_start(wed, "week") == datetime(2026, 11, 30, tzinfo=UTC)  # Monday
    assert bucket_label(bucket_start(wed, "week"), "week") == "2026-W49"
    naive = datetime(2026, 12, 2, 23, 59)  # SQLite hands back naive UTC
    assert bucket_start(naive, "day") == datetime(2026, 12, 2, tzinfo=UTC)
    starts = buckets_between(
        datetime(2026, 11, 30, 12, tzinfo=UTC), datetime(2026, 12, 2, 1, tzinfo=UTC), "day"
    )
    assert [s.day for s in starts] == [30, 1, 2]
    counts = count_by_bucket([wed, wed, datetime(2026, 12, 8, tzinfo=UTC)], "week")
    assert list(counts.values()) == [2, 1]


def test_observed_intervals_leave_out_silences() -> None:
    spans = observed_intervals([0, 10, 20, 500, 510], max_gap_s=60)
    assert spans == [(0, 20), (500, 510)]
    assert overlap_s(spans, 15, 505) == pytest.approx(5 + 5)
