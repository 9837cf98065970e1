"""A generated month looked at every day with the evaluator's own functions, old rule and new.

For each day ``d`` of a month from :mod:`shadow_ab.dev.months`, the window from the month's
start to day ``d`` is judged as the review judges it: the measurements come from the same
interval functions the analyses call (``evaluator.stats.paired_comparison`` for the TTFT p95
ratio, ``evaluator.rates.compare_failure_shares`` and ``compare_poisson_rates`` for the error
and crash rate ratios, ``evaluator.rates.newcombe_interval`` for the divergence excess,
``evaluator.rates.rate_measurement`` for the candidate's own rates), at the level the policy's
plan gives the look (:meth:`evaluator.policy.Policy.look`), and ``evaluator.verdict.decide``
decides. When those functions change (a cluster bootstrap, episode counts, an overdispersion
factor) the figures here follow: :func:`measurements` is the one place that calls them.

The **old rule** is the verdict as it was before the sequential decision (a frozen copy below):
every look at 95 %, NO-GO on any criterion's FAIL whatever the window's length, ``pass_if_zero``
passing on zero candidate events alone.

The simulated criteria are the default policy's on these four keys; their share of the
family-wise budget is the default policy's (``false_nogo / K`` each, K its criteria: 16), so
each criterion is judged at exactly the level the shipped policy gives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from evaluator.blocks import (
    MIN_HOURS,
    Blocks,
    hour_weighted_quantiles,
    hour_weights,
    shifted_interval,
)
from evaluator.policy import Criterion, Policy, default_policy
from evaluator.rates import compare_dispersed_rates, newcombe_interval, rate_measurement
from evaluator.results import Interval, Measurement
from evaluator.review import data_measurements
from evaluator.verdict import Decision, Outcome, decide
from shadow_ab.dev.months import Month, divergence_counts

SIMULATED = (
    "latency.ttft.p95.ratio",
    "errors.rate_ratio",
    "incidents.crash.rate_ratio",
    "divergence.excess_rate",
    "divergence.hard_excess_rate",
)
"""The criteria a generated month measures (the rest of the default policy is not simulated)."""


def simulated_policy(base: Policy | None = None, keys: tuple[str, ...] = SIMULATED) -> Policy:
    """``base`` (the default policy) cut to the simulated criteria named in ``keys``, each
    keeping the share of the family-wise budget it has in ``base``."""
    base = base or default_policy()
    keep = tuple(c for c in base.criteria if c.key in keys and c.key in SIMULATED)
    share = base.false_nogo * len(keep) / len(base.criteria)
    return replace(base, criteria=keep, false_nogo=share, min_pairs=0)


@dataclass(frozen=True)
class Settings:
    """How the latency sample and its bootstrap are sized (the review: 40 000 pairs, 999)."""

    latency_pairs: int = 40_000
    resamples: int = 999


def measurements(
    month: Month,
    day: int,
    level: float,
    settings: Settings,
    *,
    latency: bool = True,
    ttft: Measurement | None = None,
    keys: frozenset[str] | None = None,
) -> list[Measurement]:
    """What the review measures at a look on ``day``, every interval at ``level`` (the
    latency bootstrap, the costly part, only with ``latency``; ``ttft``: its measurement
    already computed at ``level`` by :func:`ttft_p95`; ``keys``: only the count criteria
    named, when given)."""
    out: list[Measurement] = []
    if latency:
        out.append(ttft or ttft_p95(month, day, (level,), settings)[level])
    if keys is not None and not keys & {
        "errors.rate_ratio",
        "divergence.excess_rate",
        "divergence.hard_excess_rate",
    }:
        return out + _crash(month, day, level) + _data(month, day)

    # errors.rate_ratio as the review's failure_comparison: failed / sent per UTC day, the
    # counts divided by the overdispersion of the per-day failures (bursts)
    per_day = {
        r: (
            month.failed[r][:day].astype(float).tolist(),
            month.sent[r][:day].astype(float).tolist(),
        )
        for r in ("candidate", "incumbent")
    }
    e = compare_dispersed_rates(*per_day["candidate"], *per_day["incumbent"], level)
    out.append(
        Measurement(
            "errors.rate_ratio", e.ratio, e.interval, e.x1 + e.x2, "ratio", restate=e.interval_at
        )
    )
    failed_c, sent_c = (round(sum(x)) for x in per_day["candidate"])
    out.append(rate_measurement("errors.candidate_rate", failed_c, sent_c, level, "", ""))

    out += _crash(month, day, level)

    rng = np.random.default_rng(day)
    k1, n1 = divergence_counts(month, "candidate", day, rng)
    k2, n2 = divergence_counts(month, "replay", day, rng)
    excess = Measurement(
        "divergence.excess_rate",
        k1 / n1 - k2 / n2,
        newcombe_interval(k1, n1, k2, n2, level),
        n1,
        "share",
        restate=partial(newcombe_interval, k1, n1, k2, n2),
    )
    # the generated divergences have no near ties: the hard excess (the default policy's
    # divergence criterion) is the excess
    out += [excess, replace(excess, key="divergence.hard_excess_rate")]
    return out + _data(month, day)


def _data(month: Month, day: int) -> list[Measurement]:
    pairs = month.cumulative("sent", "candidate", day)
    return data_measurements({"pairs": pairs, "days": float(day)})


def _crash(month: Month, day: int, level: float) -> list[Measurement]:
    """``incidents.crash.rate_ratio`` as the review's incident_section: episodes (a crash loop
    is one) per observed day, overdispersion from the per-day counts; the zero budget is held
    against the candidate's incidents (restarts) per day."""
    out = []
    ones = [1.0] * day
    ep_c, ep_i = (
        month.episodes[r][:day].astype(float).tolist() for r in ("candidate", "incumbent")
    )
    c = compare_dispersed_rates(ep_c, ones, ep_i, ones, level)
    n_c = month.cumulative("crashes", "candidate", day)
    n_i = month.cumulative("crashes", "incumbent", day)
    out.append(
        Measurement(
            "incidents.crash.rate_ratio",
            c.ratio,
            c.interval,
            n_c + n_i,
            "ratio",
            restate=c.interval_at,
        )
    )
    out.append(rate_measurement("incidents.crash.candidate_rate", n_c, float(day), level, "", ""))
    return out


def ttft_p95(
    month: Month, day: int, levels: tuple[float, ...], settings: Settings
) -> dict[float, Measurement]:
    """``latency.ttft.p95.ratio`` at a look on ``day``, at each of ``levels``: the review's
    paired block bootstrap (:func:`evaluator.stats.paired_comparison`: each pair's UTC day and
    hour, whole days then hours resampled, weighted quantiles, percentile interval moved onto
    the interpolated estimate, the normal approximation beyond the levels the resamples
    resolve), its resamples drawn once and read at every level, and of the p95 ratio alone
    (the review computes p50..p99, spread and delta from the same weights)."""
    inc, cand = month.ttft_sample(day, settings.latency_pairs)
    n = int(inc.size)
    point = np.array([np.quantile(cand, 0.95) / np.quantile(inc, 0.95)])
    rng = np.random.default_rng(day)
    # the review's blocks: each pair's UTC day and hour (a look holds >= MIN_HOURS hours)
    assert 24 * day >= MIN_HOURS
    take = n // (24 * day)
    hours = np.repeat(np.arange(24 * day), take)
    blocks = Blocks(hours.astype(np.intp), np.arange(24 * day, dtype=np.intp) // 24)
    hour_w = np.concatenate(list(hour_weights(blocks, settings.resamples, rng)))
    # the same weighted (inverted-CDF) quantiles as weighted_quantiles_rows, computed per hour
    reps = (
        hour_weighted_quantiles(cand, blocks, hour_w, (0.95,))
        / hour_weighted_quantiles(inc, blocks, hour_w, (0.95,))
    ).T
    # at unit weights the weighted inverted-CDF quantile is numpy's "inverted_cdf" one (no sort)
    at_ones = np.array(
        [
            np.quantile(cand, 0.95, method="inverted_cdf")
            / np.quantile(inc, 0.95, method="inverted_cdf")
        ]
    )
    out = {}
    for level in levels:
        low, high = shifted_interval(reps, level, at_ones, point)
        iv = Interval(float(low[0]), float(high[0]), level)
        if math.isnan(iv.low) or math.isnan(iv.high):
            out[level] = Measurement("latency.ttft.p95.ratio", float(point[0]), None, n, "ratio")
        else:
            out[level] = Measurement("latency.ttft.p95.ratio", float(point[0]), iv, n, "ratio")
    return out


# -- the old rule, as evaluator/verdict.py had it before the sequential decision ----------


def old_judge(c: Criterion, m: Measurement | None) -> Outcome:
    if m is None:
        return Outcome.INCONCLUSIVE
    no_events = m.value is None and (m.n == 0 or m.interval is None or m.interval.low == 0)
    if c.pass_if_zero and (m.value == 0 or no_events):
        return Outcome.PASS
    if m.value is None or m.n < c.min_n or m.interval is None:
        return Outcome.INCONCLUSIVE
    low, high = m.interval.low, m.interval.high
    if math.isnan(low) or math.isnan(high):
        return Outcome.INCONCLUSIVE
    if (high <= c.threshold) if c.op == "<=" else (low >= c.threshold):
        return Outcome.PASS
    if (low > c.threshold) if c.op == "<=" else (high < c.threshold):
        return Outcome.FAIL
    return Outcome.INCONCLUSIVE


def old_decide(policy: Policy, ms: list[Measurement], day: int) -> tuple[Decision, list[Outcome]]:
    by_key = {m.key: m for m in ms}
    outcomes = [old_judge(c, by_key.get(c.key)) for c in policy.criteria]
    if Outcome.FAIL in outcomes:
        return Decision.NO_GO, outcomes
    if Outcome.INCONCLUSIVE in outcomes or day < policy.min_days:
        return Decision.INCONCLUSIVE, outcomes
    return Decision.GO, outcomes


# -- a month of looks ---------------------------------------------------------------------


@dataclass
class Trace:
    """One rule's outcomes over a month's daily looks."""

    decisions: list[Decision] = field(default_factory=list)
    outcomes: list[list[Outcome]] = field(default_factory=list)
    """Per look, per criterion (the policy's order)."""

    def nogo(self) -> bool:
        return Decision.NO_GO in self.decisions

    def go(self) -> bool:
        return Decision.GO in self.decisions

    def failed(self, i: int) -> bool:
        return any(o[i] is Outcome.FAIL for o in self.outcomes)

    def passed(self, i: int) -> bool:
        return any(o[i] is Outcome.PASS for o in self.outcomes)

    def alerted(self, i: int) -> bool:
        return any(o[i] is Outcome.ALERT for o in self.outcomes)


def normal_restated(ms: list[Measurement]) -> list[Measurement]:
    """``ms`` without their intervals' own methods: the verdict then restates every interval
    at the PASS and ALERT levels by the normal approximation, and holds a zero budget at the
    look's level (the rule before the exact restatement: the bench's ``norm`` rows)."""
    return [replace(m, restate=None) for m in ms]


def look_month(
    month: Month, policy: Policy, settings: Settings, *, old: bool = True, norm: bool = False
) -> dict[str, Trace]:
    """The month looked at every day: ``{"new": Trace, "old": Trace}`` (``"norm"`` too with
    ``norm``: the new rule with the PASS level restated by the normal approximation)."""
    traces = {"new": Trace(), "old": Trace()} if old else {"new": Trace()}
    if norm:
        traces["norm"] = Trace()
    latency = any(c.key == "latency.ttft.p95.ratio" for c in policy.criteria)
    keys = frozenset(c.key for c in policy.criteria)
    for day in range(1, month.shape.days + 1):
        look = policy.look(float(day))
        ttft = ttft_p95(month, day, (look.level, 0.95), settings) if latency else {}
        ms = measurements(
            month, day, look.level, settings, latency=latency, ttft=ttft.get(look.level), keys=keys
        )
        verdict = decide(policy, ms)
        traces["new"].decisions.append(verdict.decision)
        traces["new"].outcomes.append([r.outcome for r in verdict.results])
        if norm:
            before = decide(policy, normal_restated(ms))
            traces["norm"].decisions.append(before.decision)
            traces["norm"].outcomes.append([r.outcome for r in before.results])
        if old:
            ms = measurements(
                month, day, 0.95, settings, latency=latency, ttft=ttft.get(0.95), keys=keys
            )
            decision, outcomes = old_decide(policy, ms, day)
            traces["old"].decisions.append(decision)
            traces["old"].outcomes.append(outcomes)
    return traces
