"""The log-bucketed sketch: quantiles within its relative accuracy of exact, merge, subtract."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluator.sketch import RELATIVE_ACCURACY, LogSketch, bucket_index

QS = [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]


def _exact(values: np.ndarray, q: float) -> float:
    """The order statistic the sketch estimates: rank floor(q (n - 1))."""
    return float(np.sort(values)[math.floor(q * (values.size - 1))])


@pytest.mark.parametrize("sigma", [0.1, 0.5, 2.0])
def test_quantiles_within_relative_accuracy(sigma: float) -> None:
    values = np.random.default_rng(1).lognormal(np.log(0.05), sigma, 20_000)
    sketch = LogSketch.of(values)
    assert sketch.count == values.size
    for q, est in zip(QS, sketch.quantiles(QS), strict=True):
        exact = _exact(values, q)
        assert abs(est - exact) <= RELATIVE_ACCURACY * exact + 1e-15, (q, est, exact)


def test_merge_equals_sketch_of_union_and_subtract_undoes_it() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.lognormal(0, 1, 5000), rng.lognormal(1, 0.3, 3000)
    merged = LogSketch.of(a).merge(LogSketch.of(b))
    whole = LogSketch.of(np.concatenate([a, b]))
    assert merged.keys.tolist() == whole.keys.tolist()
    assert merged.counts.tolist() == whole.counts.tolist()
    assert merged.quantiles(QS) == whole.quantiles(QS)
    back = merged.subtract(LogSketch.of(b))
    assert back.counts.tolist() == LogSketch.of(a).counts.tolist()
    assert back.count == a.size
    with pytest.raises(ValueError):
        LogSketch.of(a).subtract(LogSketch.of(b * 100))


def test_from_parts_merges_many_sparse_rows() -> None:
    rng = np.random.default_rng(3)
    chunks = [rng.lognormal(0, 0.5, 100) for _ in range(50)]
    parts = [LogSketch.of(c) for c in chunks]
    merged = LogSketch.from_parts(
        [p.keys for p in parts],
        [p.counts for p in parts],
        sum=sum(p.sum for p in parts),
        min=min(p.min for p in parts),
        max=max(p.max for p in parts),
    )
    whole = LogSketch.of(np.concatenate(chunks))
    assert merged.quantiles(QS) == whole.quantiles(QS)
    assert merged.mean == pytest.approx(whole.mean)


def test_zeros_and_empty() -> None:
    sketch = LogSketch.of([0.0, 0.0, 0.0, 1.0])
    assert sketch.zero_count == 3
    assert sketch.quantile(0.5) == 0.0
    assert sketch.quantile(1.0) == pytest.approx(1.0, rel=RELATIVE_ACCURACY)
    empty = LogSketch()
    assert empty.count == 0 and math.isnan(empty.quantile(0.5))
    assert empty.cdf_points() == ([], [])


def test_bucket_index_matches_the_sql_formula() -> None:
    gamma = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
    for x in (1e-4, 0.05, 1.0, 3.3, 1234.5):
        assert bucket_index([x])[0] == math.floor(math.log(x) / math.log(gamma))


def test_cdf_points_are_monotone_and_bounded() -> None:
    values = np.random.default_rng(4).lognormal(0, 1, 10_000)
    xs, ps = LogSketch.of(values).cdf_points(max_points=50)
    assert len(xs) <= 50
    assert xs == sorted(xs) and ps == sorted(ps)
    assert ps[-1] == 1.0
    # each point's probability is the empirical CDF at its bucket's upper edge: between the
    # CDF at x / (1 + a) and at x / (1 - a) (the bucket's edges around its value x)
    for x, p in zip(xs, ps, strict=True):
        lo = np.mean(values < x / (1 + RELATIVE_ACCURACY))
        hi = np.mean(values <= x / (1 - RELATIVE_ACCURACY))
        assert lo - 1e-9 <= p <= hi + 1e-9
