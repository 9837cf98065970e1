"""The verdict: PASS / FAIL / INCONCLUSIVE per criterion from its interval, GO / NO-GO /
INCONCLUSIVE overall, and an A/A run that is never NO-GO."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from evaluator.policy import Criterion, Policy, default_policy, parse_policy
from evaluator.rates import rate_measurement
from evaluator.results import Interval, Measurement
from evaluator.verdict import Decision, Outcome, decide, judge

LE = Criterion(key="latency.ttft.p95.ratio", op="<=", threshold=1.10)
GE = Criterion(key="latency.goodput.delta", op=">=", threshold=-0.05)


def ratio(value: float | None, low: float, high: float, n: int = 1000) -> Measurement:
    return Measurement("latency.ttft.p95.ratio", value, Interval(low, high), n, "ratio")


def data(pairs: int = 5000, days: float = 30.0) -> list[Measurement]:
    return [
        Measurement("data.pairs", pairs, None, pairs, "count"),
        Measurement("data.days", days, None, pairs, "days"),
    ]


@pytest.mark.parametrize(
    ("low", "high", "outcome", "words"),
    [
        (0.95, 1.05, Outcome.PASS, "at or below 1.1"),
        (1.00, 1.10, Outcome.PASS, "at or below"),  # the threshold itself is acceptable
        (1.12, 1.30, Outcome.FAIL, "above 1.1"),
        (1.05, 1.15, Outcome.INCONCLUSIVE, "straddles"),
    ],
)
def test_interval_against_threshold(low: float, high: float, outcome: Outcome, words: str) -> None:
    r = judge(LE, ratio((low + high) / 2, low, high))
    assert r.outcome is outcome
    assert words in r.reason
    assert "interval" in r.reason  # the statistic is always shown with its interval


def test_greater_or_equal_direction() -> None:
    def m(low: float, high: float) -> Measurement:
        return Measurement(GE.key, (low + high) / 2, Interval(low, high), 500, "share")

    assert judge(GE, m(-0.01, 0.02)).outcome is Outcome.PASS
    assert judge(GE, m(-0.2, -0.1)).outcome is Outcome.FAIL
    assert judge(GE, m(-0.1, 0.0)).outcome is Outcome.INCONCLUSIVE


def test_thin_data_is_inconclusive() -> None:
    c = Criterion(key=LE.key, op="<=", threshold=1.1, min_n=200)
    assert judge(c, None).outcome is Outcome.INCONCLUSIVE
    assert judge(c, ratio(None, 0.9, 1.0)).outcome is Outcome.INCONCLUSIVE
    few = judge(c, ratio(1.5, 1.4, 1.6, n=50))
    assert few.outcome is Outcome.INCONCLUSIVE and "fewer than the 200" in few.reason


def test_point_estimate_alone_never_decides() -> None:
    """Sparse errors: a ratio of 3 from 3 vs 1 failures is no evidence without its interval."""
    c = Criterion(key="errors.rate_ratio", op="<=", threshold=1.5)
    bare = Measurement("errors.rate_ratio", 3.0, None, 4, "ratio")
    r = judge(c, bare)
    assert r.outcome is Outcome.INCONCLUSIVE and "point estimate" in r.reason
    # With its exact interval the same sparse figure straddles: still not a FAIL.
    exact = Measurement("errors.rate_ratio", 3.0, Interval(0.24, 157.0), 4, "ratio")
    assert judge(c, exact).outcome is Outcome.INCONCLUSIVE


def test_counts_are_exact() -> None:
    c = Criterion(key="incidents.leak.candidate_count", op="<=", threshold=0)
    assert judge(c, Measurement(c.key, 0, None, 0, "count")).outcome is Outcome.PASS
    assert judge(c, Measurement(c.key, 1, None, 1, "count")).outcome is Outcome.FAIL


def test_pass_if_zero_needs_the_candidates_rate_bounded_within_the_budget() -> None:
    """Zero events pass only when the exact upper bound of the candidate's rate is within the
    policy's budget: zero crashes in two days bound nothing (upper bound 1.84/day at 95 %)."""
    c = Criterion(
        key="incidents.crash.rate_ratio", op="<=", threshold=2, pass_if_zero=True, zero_budget=0.25
    )

    def rate(days: float) -> dict[str, Measurement]:
        m = rate_measurement("incidents.crash.candidate_rate", 0, days, 0.95, "per day", "")
        return {m.key: m}

    none_at_all = Measurement(c.key, None, None, 0, "ratio")
    zero_vs_zero = Measurement(c.key, None, Interval(0.0, float("inf")), 20000, "ratio")
    none_on_candidate = Measurement(c.key, 0.0, Interval(0.0, 4.0), 3, "ratio")
    for m in (none_at_all, zero_vs_zero, none_on_candidate):
        short = judge(c, m, rates=rate(2.0))
        assert short.outcome is Outcome.INCONCLUSIVE, short.reason
        assert "above the budget 0.25" in short.reason
        long = judge(c, m, rates=rate(30.0))  # upper bound 3.69 / 30 = 0.123 per day
        assert long.outcome is Outcome.PASS and "within the budget 0.25" in long.reason
    # Without a budget, or without the candidate's rate, zero events do not pass on their own.
    no_budget = Criterion(key=c.key, op="<=", threshold=2, pass_if_zero=True)
    assert judge(no_budget, none_at_all, rates=rate(30.0)).outcome is Outcome.INCONCLUSIVE
    assert judge(c, none_at_all).outcome is Outcome.INCONCLUSIVE
    # At a look's stricter level the bound is wider: 30 days at the first look do not pass.
    look = default_policy().look(1.0)
    assert judge(c, none_at_all, look, rate(30.0)).outcome is Outcome.INCONCLUSIVE


def test_nan_interval_is_inconclusive() -> None:
    nan = float("nan")
    assert judge(LE, ratio(1.0, nan, nan)).outcome is Outcome.INCONCLUSIVE


def policy_of(*criteria: str, min_pairs: int = 100, min_days: float = 1) -> Policy:
    return parse_policy({"criteria": list(criteria), "min_pairs": min_pairs, "min_days": min_days})


def test_overall_decision() -> None:
    policy = policy_of("latency.ttft.p95.ratio <= 1.10", "divergence.excess_rate <= 0.02")
    div_ok = Measurement("divergence.excess_rate", 0.0, Interval(-0.01, 0.01), 900, "share")
    div_bad = Measurement("divergence.excess_rate", 0.1, Interval(0.05, 0.15), 900, "share")
    go = decide(policy, [ratio(1.0, 0.95, 1.05), div_ok, *data()])
    assert go.decision is Decision.GO and "all 2 criteria passed" in go.reason
    no_go = decide(policy, [ratio(1.06, 1.0, 1.15), div_bad, *data()])
    assert no_go.decision is Decision.NO_GO and "divergence.excess_rate" in no_go.reason
    unsure = decide(policy, [ratio(1.06, 1.0, 1.15), div_ok, *data()])
    assert unsure.decision is Decision.INCONCLUSIVE and "latency.ttft.p95.ratio" in unsure.reason
    thin = decide(policy, [ratio(1.0, 0.95, 1.05), div_ok, *data(pairs=50)])
    assert thin.decision is Decision.INCONCLUSIVE and "too little data" in thin.reason
    short = decide(policy, [ratio(1.0, 0.95, 1.05), div_ok, *data(days=0.2)])
    assert short.decision is Decision.INCONCLUSIVE and "days" in short.reason
    unknown = decide(policy, [ratio(1.0, 0.95, 1.05), div_ok])
    assert unknown.decision is Decision.INCONCLUSIVE
    body = no_go.to_dict()
    assert body["decision"] == "NO-GO" and body["counts"]["FAIL"] == 1
    # The 95 % interval handed in was widened to the look's level (day 30 of 30) and judged so.
    judged = body["criteria"][1]["measurement"]["interval"]
    assert judged["level"] == pytest.approx(body["look"]["level"]) and judged["level"] > 0.95
    assert 0.04 < judged["low"] < 0.05 and "widened" in body["criteria"][1]["reason"]


def _bootstrap_ratio(
    a: np.ndarray, b: np.ndarray, stat: str, rng: np.random.Generator, n_boot: int = 200
) -> tuple[float, float, float]:
    """Paired percentile bootstrap of stat(b) / stat(a)."""

    def f(x: np.ndarray) -> np.ndarray:
        q = np.quantile(x, [0.5, 0.95, 0.99], axis=-1)
        return q[1] if stat == "p95" else q[2] - q[0]

    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = f(b[idx]) / f(a[idx])
    low, high = np.quantile(boots, [0.025, 0.975])
    return float(f(b) / f(a)), float(low), float(high)


def _exact_rate_ratio(k_cand: int, k_inc: int) -> tuple[float | None, float, float]:
    """Conditional binomial (Clopper-Pearson) interval of a ratio of Poisson rates, equal
    exposure: the candidate's share p of all events -> ratio p / (1 - p)."""
    n = k_cand + k_inc
    if n == 0:
        return None, 0.0, float("inf")
    lo = stats.beta.ppf(0.025, k_cand, n - k_cand + 1) if k_cand > 0 else 0.0
    hi = stats.beta.ppf(0.975, k_cand + 1, n - k_cand) if k_cand < n else 1.0
    value = k_cand / k_inc if k_inc else float("inf")
    return value, float(lo / (1 - lo)), float(hi / (1 - hi)) if hi < 1 else float("inf")


def synthetic_aa(seed: int, pairs: int = 3000, exchanges: int = 20000) -> list[Measurement]:
    """Measurements of an A/A run: both engines draw from the same distributions."""
    rng = np.random.default_rng(seed)
    out: list[Measurement] = []
    for metric, scale in (("ttft", 0.04), ("tpot", 0.008), ("e2e", 0.6)):
        a = rng.lognormal(np.log(scale), 0.4, pairs)
        b = rng.lognormal(np.log(scale), 0.4, pairs)
        for stat, key in (
            ("p95", f"latency.{metric}.p95.ratio"),
            ("spread", f"latency.{metric}.spread_ratio"),
        ):
            v, lo, hi = _bootstrap_ratio(a, b, stat, rng)
            out.append(Measurement(key, v, Interval(lo, hi), pairs, "ratio"))
    errors_inc, errors_cand = rng.poisson(0.01 * exchanges, 2)
    e_v, lo, hi = _exact_rate_ratio(int(errors_cand), int(errors_inc))
    n_err = int(errors_cand + errors_inc)
    out.append(Measurement("errors.rate_ratio", e_v, Interval(lo, hi), n_err, "ratio"))
    crashes = rng.poisson(0.5, 2)
    c_v, lo, hi = _exact_rate_ratio(int(crashes[1]), int(crashes[0]))
    out.append(
        Measurement("incidents.crash.rate_ratio", c_v, Interval(lo, hi), int(sum(crashes)), "ratio")
    )
    out.append(Measurement("incidents.hang.rate_ratio", None, None, 0, "ratio"))
    # The candidate's own rates over 30 observed days (``zero_budget`` is judged on them).
    out.append(
        rate_measurement("incidents.crash.candidate_rate", int(crashes[1]), 30.0, 0.95, "", "")
    )
    out.append(rate_measurement("incidents.hang.candidate_rate", 0, 30.0, 0.95, "", ""))
    out.append(Measurement("incidents.leak.candidate_count", 0, None, 0, "count"))
    out.append(
        Measurement("incidents.leak.excess_mb_per_hour", 0.0, Interval(-5.0, 5.0), 100, "MB/hour")
    )
    # Divergence: both sides differ from the incumbent at the same noise rate.
    noise = 0.01
    d_c, d_r = rng.binomial(pairs, noise), rng.binomial(pairs // 4, noise)
    p_c, p_r = d_c / pairs, d_r / (pairs // 4)
    se = np.sqrt(p_c * (1 - p_c) / pairs + max(p_r, 1 / pairs) / (pairs // 4))
    for key in (
        "divergence.excess_rate",
        "divergence.hard_excess_rate",
        "divergence.finish_mismatch.excess",
    ):
        out.append(
            Measurement(
                key, p_c - p_r, Interval(p_c - p_r - 2 * se, p_c - p_r + 2 * se), pairs, "share"
            )
        )
    shift = rng.normal(0.0, 0.005)  # the same answer lengths, up to noise
    out.append(
        Measurement(
            "divergence.length_shift",
            shift,
            Interval(shift - 0.01, shift + 0.01),
            pairs,
            "log ratio",
        )
    )
    return out + data(pairs=pairs, days=30)


def test_aa_runs_are_never_no_go() -> None:
    policy = default_policy().with_minimums(min_pairs=100)
    decisions = [decide(policy, synthetic_aa(seed)).decision for seed in range(20)]
    assert Decision.NO_GO not in decisions
    assert Decision.GO in decisions  # the A/A check is not vacuous: the policy can pass


def test_variance_increase_with_same_median_fails_on_spread() -> None:
    """Kayenta's blind spot: same median, wider tail -> the spread criterion catches it."""
    rng = np.random.default_rng(7)
    a = rng.lognormal(np.log(0.5), 0.2, 3000)
    b = np.median(a) * np.exp(rng.normal(0, 0.6, 3000))  # same median, three times the sigma
    assert abs(np.median(b) / np.median(a) - 1) < 0.05
    v, lo, hi = _bootstrap_ratio(a, b, "spread", rng)
    m = Measurement("latency.e2e.spread_ratio", v, Interval(lo, hi), 3000, "ratio")
    c = Criterion(key="latency.e2e.spread_ratio", op="<=", threshold=1.25)
    assert judge(c, m).outcome is Outcome.FAIL
