"""Theil-Sen leak detection on plain series: known slopes, restarts, noise, flat memory."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.incidents.leak import MB, LeakParams, binned, find_leaks, split_at, theil_sen, trend

T0 = 1_796_040_000.0  # 2026-11-30 12:00 UTC
BASE = 70_000 * MB


def _series(
    hours: float, mb_per_hour: float, *, start_h: float = 0.0, step_s: float = 15.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(0.0, hours * 3600.0, step_s)
    grown = np.clip((t - T0) / 3600.0 - start_h, 0.0, None) * mb_per_hour * MB
    return t, BASE + grown + rng.normal(0.0, 30 * MB, len(t))


def test_theil_sen_slope_in_mb_per_hour() -> None:
    t = T0 + np.arange(0, 7200, 60.0)
    s = theil_sen(t, BASE + (t - T0) / 3600.0 * 42.0 * MB)
    assert s.mb_per_hour == pytest.approx(42.0)
    assert s.low <= 42.0 <= s.high
    assert s.n == 120


def test_theil_sen_shrugs_off_outliers() -> None:
    t = T0 + np.arange(0, 7200, 60.0)
    y = BASE + (t - T0) / 3600.0 * 10.0 * MB
    y[::7] += 5_000 * MB  # scrape glitches
    assert theil_sen(t, y).mb_per_hour == pytest.approx(10.0, rel=0.05)


def test_binned_medians() -> None:
    tb, yb = binned([0, 10, 20, 70, 80, 130], [5, 1, 3, 9, 7, 2], 60)
    assert list(tb) == [10, 75, 130] and list(yb) == [3, 8, 2]


def test_split_at_restarts() -> None:
    pieces = split_at([1, 2, 3, 10, 11], [5.0])
    assert [(i, j) for _, _, i, j in pieces] == [(0, 3), (3, 5)]


def test_leak_found_within_20_percent() -> None:
    t, y = _series(10, 150.0, start_h=2.0)
    leaks = find_leaks(t, y)
    assert len(leaks) == 1
    leak = leaks[0]
    assert leak.rate.mb_per_hour == pytest.approx(150.0, rel=0.2)
    assert leak.rate.low <= 150.0 * 1.2 and leak.rate.high >= 150.0 * 0.8
    assert T0 <= leak.start <= T0 + 3 * 3600  # it began after 2 h; the first window shows it
    assert leak.ongoing


def test_restart_resets_memory_one_leak_not_a_drop() -> None:
    t, y = _series(12, 80.0)
    restart = T0 + 7 * 3600
    after = t >= restart
    y[after] = BASE + (t[after] - restart) / 3600.0 * 80.0 * MB
    leaks = find_leaks(t, y, [restart])
    assert len(leaks) == 1 and len(leaks[0].runs) == 2
    assert leaks[0].rate.mb_per_hour == pytest.approx(80.0, rel=0.2)
    # Without knowing the restart, the windows across the drop would pull slopes down, but
    # none of them may be counted as a leak of their own.
    assert all(lk.rate.mb_per_hour > 0 for lk in find_leaks(t, y))


def test_flat_or_noisy_memory_is_no_leak() -> None:
    t, y = _series(12, 0.0, seed=3)
    assert find_leaks(t, y) == []
    s = trend(t, y)
    assert s is not None and s.low <= 0.0 <= s.high


def test_short_growth_is_not_sustained() -> None:
    # Growth for 1.5 h, then flat: below a 3 h sustain requirement.
    t = T0 + np.arange(0.0, 10 * 3600.0, 15.0)
    h = (t - T0) / 3600.0
    y = BASE + np.clip(h - 4.0, 0.0, 1.5) * 200.0 * MB
    assert find_leaks(t, y, params=LeakParams(sustain_s=3 * 3600.0)) == []
    assert len(find_leaks(t, y, params=LeakParams(sustain_s=1 * 3600.0))) == 1


def test_threshold_is_on_the_lower_bound() -> None:
    t, y = _series(10, 15.0)
    assert find_leaks(t, y, params=LeakParams(threshold_mb_h=20.0)) == []
    assert len(find_leaks(t, y, params=LeakParams(threshold_mb_h=5.0))) == 1


@pytest.mark.parametrize("n", [3, 17, 60, 151])
def test_own_theil_sen_equals_scipy_with_ties(n: int) -> None:
    from scipy import stats

    from evaluator.incidents.leak import theil_sen_slopes

    rng = np.random.default_rng(n)
    x = np.sort(rng.uniform(0.0, 2.0, n))
    x[1] = x[0]  # a repeated time
    y = 3.0 * x + rng.normal(0.0, 1.0, n)
    y[::4] = np.round(y[::4])  # repeated values
    ref = stats.theilslopes(y, x, alpha=0.95)
    assert theil_sen_slopes(x, y, 0.95) == pytest.approx((ref.slope, ref.low_slope, ref.high_slope))
