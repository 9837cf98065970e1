"""Pure statistics of the latency comparison on synthetic values with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluator.stats import (
    BootstrapConfig,
    goodput_mask,
    paired_comparison,
    pooled_comparison,
    quantiles,
    share_delta,
    weighted_quantiles,
)

FAST = BootstrapConfig(n_resamples=299, pooled_resamples=99, max_pairs=5000)


def _incumbent(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(np.log(0.05), 0.5, n)


def test_quantiles_match_numpy_linear() -> None:
    x = np.arange(1, 101, dtype=float)
    assert quantiles(x, (0.5, 0.99)).tolist() == pytest.approx([50.5, 99.01])
    assert all(math.isnan(v) for v in quantiles([], (0.5,)))


def test_candidate_20_percent_faster_ratio_interval_contains_0_8_and_excludes_1() -> None:
    inc = _incumbent(3000)
    noise = np.random.default_rng(2).lognormal(0, 0.03, inc.size)
    comp = paired_comparison(inc, 0.8 * inc * noise, FAST)
    for q in ("p50", "p95", "p99"):
        est = comp.ratios[q]
        assert est.low <= 0.8 <= est.high, (q, est)
        assert est.high < 1.0
    assert comp.median_delta.high < 0
    assert comp.rank_test_p < 1e-6
    assert comp.spread_ratio.low <= 0.8 <= comp.spread_ratio.high
    assert comp.n == 3000


def test_a_a_intervals_contain_1_and_rank_test_is_not_significant() -> None:
    inc = _incumbent(3000)
    cand = _incumbent(3000, seed=7)  # same distribution, independent draws
    comp = paired_comparison(inc, cand, FAST)
    for est in (*comp.ratios.values(), comp.spread_ratio):
        assert est.low <= 1.0 <= est.high, est
    assert comp.median_delta.low <= 0 <= comp.median_delta.high
    assert comp.rank_test_p > 0.01


def test_variance_increase_with_same_median_shows_in_spread_ratio_only() -> None:
    rng = np.random.default_rng(3)
    inc = rng.lognormal(np.log(0.05), 0.2, 4000)
    cand = rng.lognormal(np.log(0.05), 0.6, 4000)  # same median, much wider
    comp = paired_comparison(inc, cand, FAST)
    assert comp.ratios["p50"].low <= 1.0 <= comp.ratios["p50"].high
    assert comp.spread_ratio.low > 2.0


def test_pairs_with_a_missing_side_are_dropped_and_empty_input_is_nan() -> None:
    comp = paired_comparison([1.0, np.nan, 2.0, 3.0], [0.5, 1.0, np.nan, 1.5], FAST)
    assert comp.n == 2
    empty = paired_comparison([], [], FAST)
    assert empty.n == 0 and math.isnan(empty.ratios["p50"].value)


def test_subsample_cap_bounds_the_pairs_used() -> None:
    inc = _incumbent(9000)
    comp = paired_comparison(inc, inc * 0.9, BootstrapConfig(n_resamples=99, max_pairs=1000))
    assert comp.n == 1000
    assert comp.ratios["p50"].value == pytest.approx(0.9)


def test_pooled_itl_ratio_cluster_bootstrap() -> None:
    rng = np.random.default_rng(4)
    inc = [rng.lognormal(np.log(0.008), 0.3, rng.integers(5, 40)) for _ in range(600)]
    cand = [g * 0.8 for g in inc]
    ratios, spread = pooled_comparison(inc, cand, FAST)
    for est in ratios.values():
        assert est.value == pytest.approx(0.8)
        assert est.low <= 0.8 <= est.high
    assert spread.value == pytest.approx(0.8)
    other = [rng.lognormal(np.log(0.008), 0.3, g.size) for g in inc]
    ratios_aa, _ = pooled_comparison(inc, other, FAST)
    for est in ratios_aa.values():
        assert est.low <= 1.0 <= est.high, est


def test_weighted_quantiles_equal_repetition() -> None:
    values = np.array([1.0, 2.0, 3.0])
    got = weighted_quantiles(values, np.array([1.0, 0.0, 3.0]), (0.2, 0.5))
    expected = np.quantile(np.array([1.0, 3.0, 3.0, 3.0]), (0.2, 0.5), method="inverted_cdf")
    assert got.tolist() == expected.tolist()


def test_goodput_as_vllm_judges_it() -> None:
    completed = [True, True, True, False, True]
    ttft = [0.1, 0.6, 0.2, np.nan, 0.3]
    tpot = [0.01, 0.01, 0.09, np.nan, np.nan]  # last: a one-token answer, TPOT counts as 0
    good = goodput_mask(completed, ttft, tpot, [1.0] * 5, ttft_slo=0.5, tpot_slo=0.05, e2e_slo=None)
    assert good.tolist() == [True, False, False, False, True]
    # the SLO is inclusive, as vLLM's `s >= r`
    assert goodput_mask([True], [0.5], [0.05], [1.0], ttft_slo=0.5, tpot_slo=0.05, e2e_slo=1.0)[0]


def test_share_delta_interval() -> None:
    rng = np.random.default_rng(5)
    inc = rng.random(4000) < 0.90
    cand = rng.random(4000) < 0.80
    est = share_delta(inc, cand, FAST)
    assert est.low <= -0.10 <= est.high
    assert est.high < 0
    same = share_delta([True, False, True], [True, False, True], FAST)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)
