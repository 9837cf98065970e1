"""Leak detection on plain series: known slopes, restarts and refills, autocorrelated noise, and
the same data looked at on different days."""

from __future__ import annotations

import math

import numpy as np
import pytest
from memory_months import MonthSpec, noise

from evaluator.incidents.leak import (
    MB,
    LeakParams,
    binned,
    find_leaks,
    split_at,
    theil_sen,
    theil_sen_slopes,
    trend,
)

T0 = 1_796_040_000.0  # 2026-11-30 12:00 UTC
BASE = 70_000 * MB
HOUR = 3600.0


def _series(
    hours: float, mb_per_hour: float, *, start_h: float = 0.0, step_s: float = 15.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = T0 + np.arange(0.0, hours * HOUR, step_s)
    grown = np.clip((t - T0) / HOUR - start_h, 0.0, None) * mb_per_hour * MB
    return t, BASE + grown + rng.normal(0.0, 30 * MB, len(t))


def _refill(t: np.ndarray, start: float, drop_mb: float, hours: float) -> np.ndarray:
    """Memory missing after a process start at ``start``: ``drop_mb`` refilled at a steady rate
    over ``hours`` ("hundreds of MB/h for an hour, then flat"), in bytes; 0 before the start."""
    since = (t - start) / HOUR
    return np.where(since >= 0, drop_mb * np.clip(1.0 - since / hours, 0.0, 1.0), 0.0) * MB


def test_theil_sen_slope_in_mb_per_hour() -> None:
    t = T0 + np.arange(0, 7200, 60.0)
    s = theil_sen(t, BASE + (t - T0) / HOUR * 42.0 * MB)
    assert s.mb_per_hour == pytest.approx(42.0)
    assert s.low <= 42.0 <= s.high
    assert s.n == 120


def test_theil_sen_shrugs_off_outliers() -> None:
    t = T0 + np.arange(0, 7200, 60.0)
    y = BASE + (t - T0) / HOUR * 10.0 * MB
    y[::7] += 5_000 * MB  # scrape glitches
    assert theil_sen(t, y).mb_per_hour == pytest.approx(10.0, rel=0.05)


def test_binned_medians() -> None:
    tb, yb = binned([0, 10, 20, 70, 80, 130], [5, 1, 3, 9, 7, 2], 60)
    assert list(tb) == [10, 75, 130] and list(yb) == [3, 8, 2]


def test_split_at_restarts() -> None:
    pieces = split_at([1, 2, 3, 10, 11], [5.0])
    assert [(i, j) for _, _, i, j in pieces] == [(0, 3), (3, 5)]


@pytest.mark.parametrize("n", [3, 17, 60, 151])
def test_own_theil_sen_equals_scipy_with_ties(n: int) -> None:
    from scipy import stats

    rng = np.random.default_rng(n)
    x = np.sort(rng.uniform(0.0, 2.0, n))
    x[1] = x[0]  # a repeated time
    y = 3.0 * x + rng.normal(0.0, 1.0, n)
    y[::4] = np.round(y[::4])  # repeated values
    ref = stats.theilslopes(y, x, alpha=0.95)
    assert theil_sen_slopes(x, y, 0.95) == pytest.approx((ref.slope, ref.low_slope, ref.high_slope))


def test_leak_found_within_20_percent() -> None:
    t, y = _series(10, 150.0, start_h=2.0)
    leaks = find_leaks(t, y)
    assert len(leaks) == 1
    leak = leaks[0]
    assert leak.rate.mb_per_hour == pytest.approx(150.0, rel=0.2)
    assert leak.rate.low <= 150.0 * 1.2 and leak.rate.high >= 150.0 * 0.8
    assert T0 + 1.5 * HOUR <= leak.start <= T0 + 2.5 * HOUR  # where it began
    assert leak.ongoing


def test_a_leak_on_both_sides_of_a_restart_is_one_leak() -> None:
    t, y = _series(16, 80.0)
    restart = T0 + 8 * HOUR
    after = t >= restart
    y[after] = BASE + (t[after] - restart) / HOUR * 80.0 * MB
    leaks = find_leaks(t, y, [restart])
    assert len(leaks) == 1 and len(leaks[0].runs) == 2
    assert leaks[0].rate.mb_per_hour == pytest.approx(80.0, rel=0.2)
    # Without knowing the restart, the stretches across the drop slope down, and none of
    # them may be counted as a leak of their own.
    assert all(lk.rate.mb_per_hour > 0 for lk in find_leaks(t, y))


def test_flat_or_noisy_memory_is_no_leak() -> None:
    t, y = _series(12, 0.0, seed=3)
    assert find_leaks(t, y) == []
    s = trend(t, y)
    assert s is not None and s.low <= 0.0 <= s.high


def test_short_growth_is_not_sustained() -> None:
    # Growth for 1.5 h, then flat: below a 3 h sustain requirement, although stretches of 3 h
    # holding it slope up (they are bent: growth must hold over the whole stretch).
    t = T0 + np.arange(0.0, 10 * HOUR, 15.0)
    h = (t - T0) / HOUR
    y = BASE + np.clip(h - 4.0, 0.0, 1.5) * 200.0 * MB
    assert find_leaks(t, y, params=LeakParams(sustain_s=3 * HOUR)) == []
    assert len(find_leaks(t, y, params=LeakParams(sustain_s=1 * HOUR))) == 1


def test_threshold_is_on_the_lower_bound() -> None:
    t, y = _series(10, 15.0)
    assert find_leaks(t, y, params=LeakParams(threshold_mb_h=20.0)) == []
    assert len(find_leaks(t, y, params=LeakParams(threshold_mb_h=5.0))) == 1


# Leaks made of restarts: the old rule joined runs of growth split by a restart into one leak.


def test_refill_after_a_restart_joined_to_a_short_run_before_it_is_no_leak() -> None:
    # A short noisy rise (1.5 h at 150 MB/h) just before a restart, then the new process refills
    # 500 MiB at 500 MB/h for an hour and stays flat: two short growths on either side of a
    # restart, which the old rule joined into a 3-hour leak.
    t, y = _series(24, 0.0, seed=4)
    restart = T0 + 12 * HOUR
    h = (t - T0) / HOUR
    y += np.where(t < restart, np.clip(h - 10.5, 0.0, 1.5) * 150.0 * MB, 0.0)
    y -= _refill(t, restart, 500.0, 1.0)
    assert find_leaks(t, y, [restart]) == []


@pytest.mark.parametrize("drop_mb", [300.0, 1024.0, 6144.0])
@pytest.mark.parametrize("apart_h", [2.5, 3.0, 4.0])
def test_two_restarts_hours_apart_are_no_leak(drop_mb: float, apart_h: float) -> None:
    t, y = _series(30, 0.0, seed=5)
    restarts = [T0 + 12 * HOUR, T0 + (12 + apart_h) * HOUR]
    for r in restarts:
        y -= _refill(t, r, drop_mb, 1.0)  # memory lost at the restart, refilled in an hour
        y[t >= r] = np.maximum(y[t >= r], BASE - drop_mb * MB)
    assert find_leaks(t, y, restarts) == []


def test_saturating_refill_after_the_first_start_is_no_leak() -> None:
    # The data begins with the process: 3 GiB come back as a saturating curve (time constant
    # 30 min, so still 100 MB/h two and a half hours in), then flat.
    t, y = _series(24, 0.0, seed=6)
    y -= 3072 * MB * np.exp(-(t - T0) / (0.5 * HOUR))
    assert find_leaks(t, y, [T0]) == []
    # Told nothing of the start, the refill's slowing growth is still no leak (it is bent).
    assert find_leaks(t, y) == []


def test_a_leak_that_starts_with_the_process_is_found() -> None:
    t, y = _series(12, 100.0, seed=7)
    leaks = find_leaks(t, y, [T0])
    assert len(leaks) == 1 and leaks[0].rate.mb_per_hour == pytest.approx(100.0, rel=0.2)


# No bonus for a leak still going at the end: sustain is measured over the data seen, the same
# way at every look.


@pytest.mark.parametrize("refill", ["ramp", "saturating"])
def test_restart_just_before_the_window_end_is_no_leak_at_any_look(refill: str) -> None:
    # A restart 2.5-4 h before a look's end, its refill still showing: the old rule added a
    # whole window to a run still going at the end, and reported a leak at that look that was
    # gone at the next.
    t, y = _series(72, 0.0, seed=8)
    restart = T0 + 48 * HOUR
    if refill == "ramp":
        y -= _refill(t, restart, 1024.0, 1.5)
    else:
        y -= np.where(t >= restart, 3072 * MB * np.exp(-(t - restart) / (40 * 60.0)), 0.0)
    for end_h in (50.5, 51.0, 51.5, 52.0, 53.0, 54.0, 60.0, 72.0):
        seen = t < T0 + end_h * HOUR
        assert find_leaks(t[seen], y[seen], [restart]) == [], end_h


def test_sustain_counts_only_the_data_seen_and_a_leak_stays_found() -> None:
    # 100 MB/h from hour 20 on, flat again from hour 30.
    t, y = _series(48, 0.0, seed=9)
    h = (t - T0) / HOUR
    y += np.clip(h - 20.0, 0.0, 10.0) * 100.0 * MB
    assert find_leaks(t[h < 24], y[h < 24]) == []  # 4 h of growth seen, still going: no leak
    at_27 = find_leaks(t[h < 27], y[h < 27])  # 7 h seen, still going
    assert len(at_27) == 1 and at_27[0].ongoing
    for end_h in (30, 36, 48):
        later = find_leaks(t[h < end_h], y[h < end_h])
        assert len(later) == 1, end_h
        assert abs(later[0].start - at_27[0].start) <= 0.5 * HOUR
        assert later[0].rate.mb_per_hour == pytest.approx(100.0, rel=0.2)
    assert not later[0].ongoing


# Autocorrelated noise: 2-minute bins are not independent.


def _ar1_hours(hours: float, seed: int, sd_mb: float = 50.0) -> tuple[np.ndarray, np.ndarray]:
    """AR(1) memory noise decaying over 15 minutes, one point per 2-minute bin (as the loader
    gives them), around a flat level."""
    spec = MonthSpec(noise="ar1", noise_sd_mb=sd_mb, noise_decay_min=15.0)
    t = T0 + np.arange(0.0, hours * HOUR, spec.bin_s)
    return t, BASE + noise(spec, len(t), np.random.default_rng(seed)) * MB


def test_autocorrelated_noise_widens_the_interval() -> None:
    # Flat memory with AR(1) noise: Sen's interval, which takes the 2-minute bins for
    # independent, excludes the true slope (0) in far more than 5 % of 6-hour stretches; the
    # interval widened by the effective sample size keeps to about its level.
    missed_sen = missed_widened = 0
    trials = 200
    for seed in range(trials):
        t, y = _ar1_hours(6.0, seed)
        sen = theil_sen(t, y, adjust=False)
        widened = theil_sen(t, y)
        missed_sen += not sen.low <= 0.0 <= sen.high
        missed_widened += not widened.low <= 0.0 <= widened.high
        assert widened.rho > 0.6 and widened.high - widened.low > sen.high - sen.low
    assert missed_sen / trials > 0.3
    assert missed_widened / trials < 0.1


def test_autocorrelated_noise_is_no_leak() -> None:
    # Four weeks of AR(1) noise (sd 50 MiB, 15 min), no restarts: no leak, and the trend's
    # interval holds zero.
    t, y = _ar1_hours(28 * 24.0, seed=11)
    assert find_leaks(t, y) == []
    s = trend(t, y)
    assert s is not None and s.low <= 0.0 <= s.high and math.isfinite(s.rho)


def test_a_50_mb_h_leak_of_6_hours_is_found_in_autocorrelated_noise() -> None:
    t, y = _ar1_hours(48.0, seed=12)
    h = (t - T0) / HOUR
    y += np.clip(h - 20.0, 0.0, 6.0) * 50.0 * MB
    leaks = find_leaks(t, y)
    assert len(leaks) == 1
    assert leaks[0].rate.mb_per_hour == pytest.approx(50.0, rel=0.2)
    assert T0 + 19 * HOUR <= leaks[0].start <= T0 + 21 * HOUR
