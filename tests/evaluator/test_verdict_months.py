"""The sequential decision over generated months looked at every day (shadow_ab/dev/months.py,
shadow_ab/dev/verdict_months.py): loose bounds over many seeds, not one lucky seed. The bench
(bench/verdict_validity.py) prints the full table with Wilson intervals.

The count criteria (errors, crashes, divergence) run here; the latency criterion costs a
bootstrap per look and is the bench's."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.errors import PolicyError
from evaluator.policy import default_policy, parse_policy
from evaluator.results import Interval, Measurement
from evaluator.sequential import boundaries, look_at, spent
from evaluator.verdict import Decision, Outcome, decide
from shadow_ab.dev.months import AA, AT_THRESHOLD, EFFECTS, MonthShape, generate
from shadow_ab.dev.verdict_months import Settings, look_month, simulated_policy

COUNTS = ("errors.rate_ratio", "incidents.crash.rate_ratio", "divergence.hard_excess_rate")
MONTHS = 30


def _months(kind: str, effects: str | None, months: int = MONTHS) -> list[dict]:
    shape = MonthShape(clustered=kind == "clustered")
    if effects:
        shape = shape.with_effects(EFFECTS[effects])
    policy = simulated_policy(keys=COUNTS)
    return [look_month(generate(shape, seed), policy, Settings()) for seed in range(months)]


@pytest.mark.parametrize("spending", ["obrien-fleming", "pocock"])
def test_boundaries_cross_with_the_planned_alpha(spending: str) -> None:
    """Simulated cumulative normal statistics over 30 looks cross the boundaries at some look
    with the planned probability (the recursion is right), and every look's share is spent."""
    alpha = 0.05 / 11
    c = np.array(boundaries(alpha, 30, spending))
    rng = np.random.default_rng(3)
    paths = np.cumsum(rng.normal(0, np.sqrt(1 / 30), (100_000, 30)), axis=1)
    z = paths / np.sqrt(np.arange(1, 31) / 30)
    crossed = float((z >= c).any(axis=1).mean())
    assert 0.5 * alpha < crossed < 1.5 * alpha, crossed
    assert spent(1.0, alpha, spending) == pytest.approx(alpha)
    naive = float((z >= 2.61).any(axis=1).mean())  # the same level at every look
    assert naive > 3 * alpha


def test_a_look_counts_whole_days_and_stays_at_the_last_after_the_horizon() -> None:
    plan = {"horizon_days": 30, "false_nogo": 0.05, "criteria": 11}
    early, day2, late = look_at(0.3, **plan), look_at(2.9, **plan), look_at(45, **plan)
    assert (early.look, day2.look, late.look) == (1, 2, 30)
    assert (
        early.level >= day2.level > look_at(10, **plan).level > late.level > 0.99
    )  # stricter early
    assert late.past_horizon and not look_at(30, **plan).past_horizon
    assert look_at(0.01, horizon_days=1, false_nogo=0.05, criteria=11).final  # one look


def test_the_policy_states_its_plan_and_bad_values_say_what_to_fix() -> None:
    p = default_policy()
    assert (p.horizon_days, p.false_nogo, p.spending) == (30, 0.05, "obrien-fleming")
    crash = next(c for c in p.criteria if c.key == "incidents.crash.rate_ratio")
    assert crash.pass_if_zero and crash.zero_budget == 0.25
    for bad, words in (
        ({"horizon_days": 0}, "horizon_days must be > 0"),
        ({"false_nogo": 0.7}, "false_nogo must be between"),
        ({"spending": "bonferroni"}, "spending must be one of"),
    ):
        with pytest.raises(PolicyError, match=words):
            parse_policy({"criteria": ["errors.rate_ratio <= 1.5"], **bad})
    with pytest.raises(PolicyError, match="zero_budget applies to"):
        parse_policy(
            {
                "criteria": [
                    {
                        "key": "divergence.excess_rate",
                        "op": "<=",
                        "threshold": 0.02,
                        "zero_budget": 0.1,
                    }
                ]
            }
        )


def test_beyond_the_threshold_before_min_days_is_an_alert_not_a_no_go() -> None:
    policy = parse_policy({"criteria": ["latency.ttft.p95.ratio <= 1.10"], "min_days": 3})
    bad = Measurement("latency.ttft.p95.ratio", 1.5, Interval(1.4, 1.6, 0.999999), 5000, "ratio")

    def at(days: float) -> list[Measurement]:
        level = policy.look(days).level
        m = Measurement(bad.key, 1.5, Interval(1.3, 1.7, level), 5000, "ratio")
        return [
            m,
            Measurement("data.pairs", 5000, None, 5000, "count"),
            Measurement("data.days", days, None, 5000, "days"),
        ]

    early = decide(policy, at(1.0))
    assert early.results[0].outcome is Outcome.ALERT and early.decision is Decision.INCONCLUSIVE
    assert "ALERT" in early.reason and early.look is not None and early.look.look == 1
    later = decide(policy, at(4.0))
    assert later.results[0].outcome is Outcome.FAIL and later.decision is Decision.NO_GO
    # Beyond at 95 % but not at the look's level: an ALERT too (an early warning).
    weak = Measurement(bad.key, 1.2, Interval(1.15, 1.25, 0.95), 5000, "ratio")
    r = decide(policy, [weak, *at(4.0)[1:]])
    assert r.results[0].outcome is Outcome.ALERT and r.decision is Decision.INCONCLUSIVE


@pytest.mark.parametrize("kind", ["independent", "clustered"])
def test_identical_engines_are_rarely_no_go_at_any_daily_look(kind: str) -> None:
    """A/A months looked at daily: NO-GO at some look in few months under the new rule (its
    plan allows 3/11 of 5 % to these three criteria; loose bound 10 % over 30 months), and never
    more often than under the old rule."""
    traces = _months(kind, None)
    new = sum(t["new"].nogo() for t in traces)
    old = sum(t["old"].nogo() for t in traces)
    assert new <= 0.10 * MONTHS, (new, old)
    assert new <= old
    # The rule can still say GO. The crash criterion limits it: ~22 restarts a side
    # (independent) or ~3 crash-loop episodes a side (clustered) rarely bound the ratio below 2
    # even at the PASS side's own level (bench: crash PASS at some look in 53 % / 17 % of
    # months); the data's limit, not the rule's (its power curve against the base rate).
    assert sum(t["new"].go() for t in traces) >= 1


@pytest.mark.parametrize("kind", ["independent", "clustered"])
def test_divergence_five_points_above_the_floor_is_no_go_and_never_go(kind: str) -> None:
    traces = _months(kind, "divergence")
    assert sum(t["new"].nogo() for t in traces) >= 0.9 * MONTHS
    assert sum(t["new"].go() for t in traces) <= 0.05 * MONTHS


@pytest.mark.parametrize("kind", ["independent", "clustered"])
def test_a_candidate_crashing_three_times_as_often_does_not_pass_on_a_lucky_zero(
    kind: str,
) -> None:
    """The old rule's pass_if_zero let a 3x-crashing candidate PASS on a few crash-free days,
    and counted a crash loop's restarts one by one; the new one asks for the candidate's rate
    bounded within the budget first and compares episodes, overdispersed by day."""
    traces = _months(kind, "crash")
    i = 1  # the crash criterion in simulated_policy(keys=COUNTS)
    assert simulated_policy(keys=COUNTS).criteria[i].key == "incidents.crash.rate_ratio"
    new_pass = sum(t["new"].passed(i) for t in traces)
    old_pass = sum(t["old"].passed(i) for t in traces)
    assert new_pass <= old_pass, (new_pass, old_pass)
    # Crash loops are counted as episodes with the per-day overdispersion, as the review does;
    # the PASS side has its own boundary (false_go 0.05 per criterion): a 3x candidate, beyond
    # the threshold of 2, passes in at most ~5 % of months (loose bound: 10 % of 30).
    assert new_pass <= 0.1 * MONTHS, (new_pass, old_pass)
    assert sum(t["new"].go() for t in traces) <= 0.1 * MONTHS


def test_the_generators_draw_what_their_docstring_says() -> None:
    """Clustered months are overdispersed: per-day crash and error counts vary far more than
    Poisson's (variance / mean), independent ones do not; the TTFT effect is 12 % at p95."""

    def dispersion(shape: MonthShape, name: str) -> float:
        ratios = []
        for seed in range(20):
            x = getattr(generate(shape, seed), name)["incumbent"].astype(float)
            if x.mean() > 0:
                ratios.append(x.var(ddof=1) / x.mean())
        return float(np.median(ratios))

    for name in ("crashes", "failed"):
        assert dispersion(MonthShape(clustered=False), name) < 1.6
        assert dispersion(MonthShape(clustered=True), name) > 2.0
    month = generate(MonthShape().with_effects(EFFECTS["ttft"]), 1)
    inc, cand = month.ttft_sample(30, 10_000)
    assert np.quantile(cand, 0.95) / np.quantile(inc, 0.95) == pytest.approx(1.12, abs=0.03)
    assert generate(MonthShape(), 5).crashes["candidate"].sum() == (
        generate(MonthShape().with_effects(AA), 5).crashes["candidate"].sum()
    )


def test_failure_factor_scales_the_candidates_failures_and_leaves_a_a_draws_alone() -> None:
    """The errors-on-the-threshold scenario of the bench: the candidate's failures x1.5 over
    the month (bursts alike), the incumbent's the same draws as without the effect."""
    for clustered in (False, True):
        shape = MonthShape(clustered=clustered)
        aa = generate(shape, 4)
        assert (
            generate(shape.with_effects(AA), 4).failed["candidate"] == aa.failed["candidate"]
        ).all()
        ratios = []
        for seed in range(10):
            m = generate(shape.with_effects(AT_THRESHOLD["errors@1.5"]), seed)
            ratios.append(m.failed["candidate"].sum() / m.failed["incumbent"].sum())
        assert 1.2 < float(np.median(ratios)) < 1.8, ratios


def test_the_norm_rule_is_the_new_rule_without_the_intervals_methods() -> None:
    """``look_month(norm=True)`` judges the same measurements restated by the normal
    approximation: its FAIL side is the new rule's, look for look."""
    shape = MonthShape(clustered=True)
    policy = simulated_policy(keys=COUNTS)
    for seed in range(3):
        traces = look_month(generate(shape, seed), policy, Settings(), old=False, norm=True)
        new, norm = traces["new"], traces["norm"]
        for a, b in zip(new.outcomes, norm.outcomes, strict=True):
            assert [o is Outcome.FAIL for o in a] == [o is Outcome.FAIL for o in b]
