"""The PASS (and ALERT, zero budget) level restated by the interval's own method, not by the
normal approximation: exact rate-ratio bounds, Garwood's rate bound, Newcombe's score
intervals (``Measurement.restate``, ``evaluator.verdict.restated``)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from evaluator.paired import paired_share_difference
from evaluator.policy import Criterion, default_policy
from evaluator.quality import _restate, paired_delta
from evaluator.rates import (
    compare_dispersed_rates,
    compare_poisson_rates,
    poisson_rate_interval,
    rate_measurement,
)
from evaluator.results import Measurement
from evaluator.verdict import Outcome, at_level, judge, restated

POLICY = default_policy()
LOOK = POLICY.look(30.0)


def _criterion(key: str) -> Criterion:
    return next(c for c in POLICY.criteria if c.key == key)


def _ratio(x1: int, x2: int, level: float, t: float = 30.0) -> Measurement:
    c = compare_poisson_rates(x1, t, x2, t, level)
    return Measurement(
        "incidents.crash.rate_ratio", c.ratio, c.interval, x1 + x2, "ratio", restate=c.interval_at
    )


def test_the_look_has_a_pass_level_below_its_fail_level() -> None:
    assert LOOK.pass_level is not None and LOOK.pass_level < LOOK.level


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99, 0.9999])
def test_interval_at_is_the_same_exact_method_at_another_level(level: float) -> None:
    plain = compare_poisson_rates(3, 10.0, 7, 12.0, 0.999)
    assert plain.interval_at(level) == compare_poisson_rates(3, 10.0, 7, 12.0, level).interval
    days = [0.0, 5.0, 0.0, 0.0, 1.0, 9.0]
    ones = [1.0] * len(days)
    dispersed = compare_dispersed_rates(days, ones, list(reversed(days)), ones, 0.999)
    assert dispersed.dispersion > 1.0
    again = compare_dispersed_rates(days, ones, list(reversed(days)), ones, level)
    assert dispersed.interval_at(level) == again.interval


def test_zero_candidate_events_pass_on_the_exact_bound_at_the_pass_level() -> None:
    """0 candidate against 4 incumbent crash episodes in 30 days: the exact upper bound at
    the PASS level is within 2, where the FAIL level's bound scaled down by the normal
    approximation (about an estimate of 0) is not."""
    c = _criterion("incidents.crash.rate_ratio")
    m = _ratio(0, 4, LOOK.level)
    assert LOOK.pass_level is not None
    exact = compare_poisson_rates(0, 30.0, 4, 30.0, LOOK.pass_level).interval.high
    assert exact <= c.threshold < at_level(m, LOOK.pass_level).interval.high  # type: ignore[union-attr]
    assert judge(c, m, LOOK).outcome is Outcome.PASS
    assert judge(c, replace(m, restate=None), LOOK).outcome is Outcome.INCONCLUSIVE


@pytest.mark.parametrize("x1", range(0, 6))
@pytest.mark.parametrize("x2", range(0, 16, 3))
def test_a_small_count_passes_exactly_when_its_own_bound_at_the_pass_level_does(
    x1: int, x2: int
) -> None:
    c = _criterion("incidents.crash.rate_ratio")
    assert LOOK.pass_level is not None
    m = _ratio(x1, x2, LOOK.level)
    out = judge(c, m, LOOK).outcome
    if m.value is None:  # no event on either side: the zero budget's business
        return
    own = compare_poisson_rates(x1, 30.0, x2, 30.0, LOOK.pass_level).interval
    fails = m.interval is not None and m.interval.low > c.threshold
    assert (out is Outcome.PASS) == (own.high <= c.threshold and not fails)


def test_zero_budget_is_held_against_the_exact_bound_at_the_pass_level() -> None:
    """No crash on either side in 20 days: Garwood's bound at the PASS level is within the
    budget of 0.25 a day, at the look's (FAIL) level it is not."""
    look = POLICY.look(20.0)
    assert look.pass_level is not None
    c = _criterion("incidents.crash.rate_ratio")
    assert c.zero_budget is not None
    ratio = _ratio(0, 0, look.level, t=20.0)
    rate = rate_measurement("incidents.crash.candidate_rate", 0, 20.0, look.level, "per day", "")
    assert poisson_rate_interval(0, 20.0, look.pass_level).high <= c.zero_budget
    assert poisson_rate_interval(0, 20.0, look.level).high > c.zero_budget
    rates = {rate.key: rate}
    assert judge(c, ratio, look, rates).outcome is Outcome.PASS
    stripped = {rate.key: replace(rate, restate=None)}
    assert judge(c, ratio, look, stripped).outcome is Outcome.INCONCLUSIVE
    # too little exposure still bounds nothing, at any level
    short = rate_measurement(rate.key, 0, 5.0, look.level, "per day", "")
    assert judge(c, ratio, look, {rate.key: short}).outcome is Outcome.INCONCLUSIVE


def test_no_hard_divergence_in_197_triads_passes_on_newcombe_at_the_pass_level() -> None:
    """The real-vLLM run's case: 0 of 197 hard divergences on either side."""
    c = _criterion("divergence.hard_excess_rate")
    n = 197
    est = paired_share_difference(
        [False] * n, [False] * n, [f"d{i % 30}" for i in range(n)], LOOK.level
    )
    assert est is not None and est.restate is not None
    m = Measurement(c.key, est.value, est.interval, n, "share", restate=est.restate)
    assert judge(c, m, LOOK).outcome is Outcome.PASS
    assert judge(c, replace(m, restate=None), LOOK).outcome is Outcome.INCONCLUSIVE


def test_the_quality_delta_carries_its_paired_interval_at_any_level() -> None:
    units = [(f"p{i % 40}", i % 7 != 0, i % 9 != 0) for i in range(400)]
    _, iv95, info = paired_delta(units, 0.95)
    _, iv99, _ = paired_delta(units, 0.99)
    again = _restate(info)
    assert again is not None
    assert again(0.95) == iv95 and again(0.99) == iv99


def test_restate_is_not_part_of_equality_json_or_pickling_trouble() -> None:
    m = _ratio(2, 5, 0.99)
    assert m == replace(m, restate=None)
    assert "restate" not in m.to_dict()
    back = pickle.loads(pickle.dumps(m))
    assert back.restate is not None and back.restate(0.9) == m.restate(0.9)  # type: ignore[misc]
    # no interval: nothing to restate
    none = Measurement("x", None, None, 0, "ratio")
    assert restated(none, 0.9) is none
