"""What makes the sequential verdict able to say GO and reach the extreme levels early looks ask
for: the PASS side's own boundary (``false_go``), the normal fallback of the bootstrap beyond the
levels its resamples resolve, and the per-hour weighted quantiles the verdict bench uses.
Loose bounds over many seeds (bench/verdict_validity.py prints the figures)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from evaluator.blocks import (
    Blocks,
    bootstrap_interval,
    hour_weighted_quantiles,
    hour_weights,
    resolvable,
    weighted_quantiles_rows,
)
from evaluator.errors import PolicyError
from evaluator.policy import default_policy, parse_policy
from evaluator.results import Interval, Measurement
from evaluator.sequential import boundaries, look_at
from evaluator.stats import BootstrapConfig, paired_comparison
from evaluator.verdict import Outcome, judge


def _blocks(days: int, hours_per_day: int, per_hour: int) -> Blocks:
    n_hours = days * hours_per_day
    return Blocks(
        np.repeat(np.arange(n_hours), per_hour).astype(np.intp),
        (np.arange(n_hours) // hours_per_day).astype(np.intp),
    )


@pytest.mark.parametrize("seed", range(6))
def test_hour_weighted_quantiles_are_the_weighted_quantiles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    days, per_hour = int(rng.integers(1, 8)), int(rng.integers(1, 40))
    blocks = _blocks(days, 24, per_hour)
    values = rng.lognormal(0, 0.6, len(blocks))
    values[rng.integers(0, values.size, 5)] = values[0]  # ties
    hw = np.concatenate(list(hour_weights(blocks, 120, rng)))
    qs = (0.5, 0.95, 0.99)
    fast = hour_weighted_quantiles(values, blocks, hw, qs)
    slow = weighted_quantiles_rows(values, hw[:, blocks.hour_of], qs)
    assert np.array_equal(fast, slow)


def test_hour_weights_draw_whole_days_then_their_hours() -> None:
    blocks = _blocks(5, 24, 1)
    rng = np.random.default_rng(1)
    hw = np.concatenate(list(hour_weights(blocks, 400, rng)))
    assert np.all(hw.sum(axis=1) == 5 * 24)  # each drawn day brings 24 hour draws
    per_day = hw.reshape(400, 5, 24).sum(axis=2)
    assert np.all(per_day % 24 == 0)  # a day's hours are drawn only with the day
    assert 0.9 < hw.mean() / 1.0 < 1.1 and hw.var() > 0.5  # unbiased, and it does vary


def test_beyond_what_the_resamples_resolve_the_interval_is_normal_and_keeps_widening() -> None:
    assert resolvable(0.95, 999) and not resolvable(0.999, 999)
    rng = np.random.default_rng(2)
    reps = np.exp(rng.normal(0, 0.05, (999, 1)))
    center = np.array([1.0])
    widths = []
    for level in (0.999, 1 - 1e-5, 1 - 1e-8):
        low, high, method = bootstrap_interval(reps, level, center)
        assert method == "normal"
        widths.append(float(high[0] - low[0]))
    assert widths[0] < widths[1] < widths[2]  # the percentile interval stops at the extremes
    pct_low, pct_high, method = bootstrap_interval(reps, 0.95, center)
    assert method == "percentile" and pct_high[0] - pct_low[0] < widths[0]
    # a paired comparison at an early look's level: wider than its most extreme resamples
    x = rng.lognormal(0, 0.5, 2000)
    y = x * rng.lognormal(0, 0.1, 2000)
    cfg = BootstrapConfig(n_resamples=199, level=1 - 1e-6, seed=3)
    extreme = paired_comparison(x, y, cfg).ratios["p95"]
    usual = paired_comparison(x, y, BootstrapConfig(n_resamples=199, seed=3)).ratios["p95"]
    assert extreme.high - extreme.low > 2 * (usual.high - usual.low)


def test_the_pass_side_has_its_own_boundary_not_split_over_criteria() -> None:
    plan: dict[str, Any] = {"horizon_days": 30, "false_nogo": 0.05, "criteria": 11}
    for day in (1, 3, 10, 30):
        same, own = look_at(day, **plan), look_at(day, **plan, false_go=0.05)
        assert same.pass_level == same.level and own.level == same.level
        assert own.pass_z is not None and own.pass_z <= own.z
        assert own.pass_level is not None and own.pass_level <= own.level
    last = look_at(30, **plan, false_go=0.05)
    assert last.pass_z is not None and 1.5 < last.pass_z < 2.1 < 2.5 < last.z
    assert "PASS at" in last.text()
    # one criterion's false PASS at some look, truth on the threshold: about false_go
    c = np.array(boundaries(0.05, 30, "obrien-fleming"))
    rng = np.random.default_rng(4)
    paths = np.cumsum(rng.normal(0, np.sqrt(1 / 30), (50_000, 30)), axis=1)
    crossed = float((paths / np.sqrt(np.arange(1, 31) / 30) >= c).any(axis=1).mean())
    assert 0.035 < crossed < 0.065, crossed


def test_pass_judged_at_the_pass_level_fail_at_the_look_level() -> None:
    policy = default_policy()
    assert policy.false_go == 0.05
    crit = next(c for c in policy.criteria if c.key == "latency.ttft.p95.ratio")
    look = policy.look(30.0)
    assert look.pass_level is not None and look.pass_level < look.level
    # an interval at the look's level that straddles 1.10, but whose narrower pass-level
    # interval is below it: PASS; the same width beyond it only at the pass level: undecided
    ok = Measurement(crit.key, 1.0, Interval(0.93, 1.12, look.level), 5000, "ratio")
    assert judge(crit, ok, look).outcome is Outcome.PASS
    bad = Measurement(crit.key, 1.2, Interval(1.08, 1.33, look.level), 5000, "ratio")
    assert judge(crit, bad, look).outcome is Outcome.INCONCLUSIVE
    without = replace(policy, false_go=None)
    assert parse_policy({"criteria": [f"{crit.key} <= 1.1"]}).false_go is None
    assert judge(crit, ok, without.look(30.0)).outcome is Outcome.INCONCLUSIVE
    with pytest.raises(PolicyError, match="false_go must be between"):
        parse_policy({"criteria": [f"{crit.key} <= 1.1"], "false_go": 0.9})
    assert parse_policy(policy.to_dict()).false_go == 0.05


# -- the day bootstrap (no double count of the hours) and the larger sample ------------------


def _two_level_means(rng: np.random.Generator, days: int, day_sd: float) -> np.ndarray:
    """Per hour (days x 24), the mean of 13 pairs: a day effect, an hour effect, pair noise."""
    day = np.repeat(rng.normal(0, day_sd, days), 24)
    hour = rng.normal(0, 0.05, days * 24)
    return day + hour + rng.normal(0, 0.45, (days * 24, 13)).mean(axis=1)


@pytest.mark.parametrize("day_sd", [0.0, 0.04])
def test_whole_days_bootstrap_the_variance_of_a_mean_without_double_counting_hours(
    day_sd: float,
) -> None:
    """30 days of hour means: the variance of the grand mean over resamples, against its true
    variance over 300 simulated months. Days alone (n - 1 of n drawn): about right; days then
    hours (the scheme before 7 days): the hour variance counted twice, too wide (about 2x
    without day effects)."""
    days = 30
    blocks = _blocks(days, 24, 1)
    assert blocks.days_only
    rng = np.random.default_rng(7)
    truth = float(np.var([_two_level_means(rng, days, day_sd).mean() for _ in range(300)]))
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(40):
        y = _two_level_means(rng, days, day_sd)
        for whole in (True, False):
            hw = np.concatenate(list(hour_weights(blocks, 200, rng, days_only=whole)))
            ratios[whole].append(float(np.var(hw @ y / hw.sum(axis=1))) / truth)
    whole_days, two_stage = float(np.mean(ratios[True])), float(np.mean(ratios[False]))
    assert 0.8 < whole_days < 1.2, whole_days
    # the double count is the hours' share of the variance: all of it without day effects
    assert two_stage > (1.5 if day_sd == 0 else 1.1) * whole_days, (two_stage, whole_days)


def test_whole_days_are_drawn_n_minus_one_at_a_time_and_early_looks_keep_two_stages() -> None:
    blocks = _blocks(10, 24, 1)
    hw = np.concatenate(list(hour_weights(blocks, 100, np.random.default_rng(3))))
    per_day = hw.reshape(100, 10, 24)
    assert np.all(per_day == per_day[:, :, :1])  # every hour of a day weighs as its day
    assert np.all(per_day[:, :, 0].sum(axis=1) == 9)  # 9 of 10 days drawn
    assert "days resampled whole" in blocks.describe()
    early = _blocks(6, 24, 1)
    assert not early.days_only and "hours within them" in early.describe()


def test_the_hour_weighted_paired_statistic_is_the_expanded_one() -> None:
    from evaluator.stats import _hour_weighted_paired_statistic, _weighted_paired_statistic

    rng = np.random.default_rng(5)
    blocks = _blocks(8, 24, 7)
    a = rng.lognormal(0, 0.5, len(blocks))
    b = a * rng.lognormal(0, 0.2, len(blocks))
    hw = np.concatenate(list(hour_weights(blocks, 30, rng)))
    fast = _hour_weighted_paired_statistic(a, b, blocks, hw)
    slow = _weighted_paired_statistic(a, b, hw[:, blocks.hour_of])
    assert np.array_equal(fast, slow)
    assert BootstrapConfig().max_pairs == 40_000


# -- what a count criterion can detect ------------------------------------------------------


def _crash_verdict(per_day: float, days: int, factor: float = 3.0) -> Any:
    from evaluator.rates import compare_dispersed_rates
    from evaluator.review import data_measurements
    from evaluator.verdict import decide

    policy = default_policy()
    look = policy.look(float(days))
    x_i = per_day * days
    c = compare_dispersed_rates([factor * x_i], [float(days)], [x_i], [float(days)], look.level)
    key = "incidents.crash.rate_ratio"
    m = Measurement(key, c.ratio, c.interval, round(x_i * (1 + factor)), "ratio")
    verdict = decide(policy, [m, *data_measurements({"pairs": 10**6, "days": float(days)})])
    return next(r for r in verdict.results if r.criterion.key == key)


def test_thin_crash_data_is_said_to_be_underpowered_rich_data_is_not() -> None:
    thin = _crash_verdict(0.1, 30)  # ~3 incumbent and ~9 candidate episodes
    assert thin.outcome is Outcome.INCONCLUSIVE
    assert thin.detectable is not None and thin.detectable > 20
    assert "underpowered" in thin.reason and "incumbent events" in thin.reason
    rich = _crash_verdict(10.0, 10)  # not yet at the horizon: projected to it
    assert rich.detectable is not None and rich.detectable < 3.0
    assert "underpowered" not in rich.reason and "by the horizon" in rich.reason
    assert rich.to_dict()["detectable_ratio"] == rich.detectable
    failed = _crash_verdict(10.0, 30)
    assert failed.outcome is Outcome.FAIL and failed.detectable is None
    assert "power:" not in failed.reason
    none = _crash_verdict(0.0, 5)
    assert none.detectable is None and "too few events" in none.reason


def test_the_detectable_ratio_is_failed_about_ninety_percent_of_the_time_at_the_last_look() -> None:
    """Poisson counts at the ratio the note states (from one month at the same base rate):
    the last look FAILs it in about 90 % of months (one look: loose bounds)."""
    from evaluator.rates import compare_poisson_rates

    policy = default_policy()
    look = policy.look(30.0)
    base = 300.0  # incumbent events in the month
    c = compare_poisson_rates(round(2 * base), 30.0, round(base), 30.0, look.level)
    m = Measurement("incidents.crash.rate_ratio", c.ratio, c.interval, 900, "ratio")
    from evaluator.power import detectable_ratio

    r = detectable_ratio(m, 2.0, look)
    assert r is not None and 2.0 < r < 3.0
    rng = np.random.default_rng(11)
    fails = 0
    for _ in range(300):
        x_i = int(rng.poisson(base))
        x_c = int(rng.poisson(base * r))
        iv = compare_poisson_rates(x_c, 30.0, x_i, 30.0, look.level).interval
        fails += iv is not None and iv.low > 2.0
    assert 0.8 < fails / 300 < 0.97, fails
