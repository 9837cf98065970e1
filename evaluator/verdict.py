"""The verdict: each policy criterion judged on its measurement's interval, then GO / NO-GO /
INCONCLUSIVE overall, each with the statistic, its interval and a reason sentence.

The review is looked at every day of a planned horizon, so each look is judged at the level
the policy's plan gives it (:meth:`Policy.look`, :mod:`evaluator.sequential`): the analyses
compute their intervals at that level, and a look's interval beyond the threshold is the
sequential boundary crossed. An interval handed in at a lower level than the look's is widened
to it first (normal approximation about the estimate, on the log scale for ratios), and the
reason says so.

Per criterion (``op`` ``<=``; ``>=`` mirrors it):

- **PASS** when the whole interval is on the good side (``high <= threshold``);
- **FAIL** when the whole interval is beyond the threshold (``low > threshold``);
- **INCONCLUSIVE** when the interval straddles the threshold, the measurement is missing or
  has no value, its sample ``n`` is below the criterion's ``min_n``, or it is an estimate that
  came without an interval (a point estimate alone never decides: that is how sparse error
  counts fool a judge). Observed counts (unit ``count``) are exact and judged on their value.

- **ALERT** (shown, never a NO-GO) when the interval is beyond the threshold but the window
  is shorter than the policy's ``min_days``, or when it is beyond only at the policy's
  ``alert_level`` (95 %), not at the look's level: an early warning, not yet evidence.

Sparse events: a criterion with ``pass_if_zero`` PASSes when nothing was seen on the
candidate (the value is 0, or the ratio has no value because neither engine had an event)
*and* the exact upper bound of the candidate's own rate (``<...>.candidate_rate``, at the
PASS side's level when the rate carries its method, else at the look's) is within the
criterion's ``zero_budget``: zero crashes in two days bound nothing. Without a budget, zero
events do not pass on their own.

**PASS has its own level** when the policy sets ``false_go``: the interval restated at the
look's ``pass_level``, whose boundary spends ``false_go`` per criterion over the looks. A
measurement that carries its interval's method (``Measurement.restate``: the exact conditional
binomial of the rate ratios, Garwood's rate interval, Newcombe's score intervals) is recomputed
at that level by the same method as the FAIL side's; any other by the normal approximation
about the estimate, as above. The same holds for the ALERT level, and a ``zero_budget`` is held
against the exact bound at the PASS level. A false GO needs the one criterion the candidate is
really worse on to PASS, so that side is not split over the criteria as the FAIL side is.

Overall: **NO-GO** if any criterion FAILs (the boundary crossed, at least ``min_days`` of
data); else **INCONCLUSIVE** if any is INCONCLUSIVE or ALERT or the window holds fewer pairs or
days than the policy asks; else **GO**: every criterion's interval at the look's level -- a
repeated confidence interval, valid at every look of the plan at once -- wholly on the good
side. Pure functions, no I/O.

**Power of count criteria**: a rate ratio that does not FAIL gets, in its reason, the smallest
true ratio it would NO-GO by the horizon with 90 % probability at the pace of events so far,
and "underpowered" with the events it would take when that is above 1.5x its threshold
(:mod:`evaluator.power`): an INCONCLUSIVE or a GO on thin crash data says what it could not
have seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from evaluator.policy import Criterion, Policy
from evaluator.power import power_note
from evaluator.results import Interval, Measurement
from evaluator.sequential import Look, level_text, z_of

EXACT_UNITS = frozenset({"count", "p-value"})
"""Units of figures that are observed, not estimated: judged on their value alone."""


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ALERT = "ALERT"


class Decision(StrEnum):
    GO = "GO"
    NO_GO = "NO-GO"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True)
class CriterionResult:
    """One criterion's outcome with the figure it was judged on and why."""

    criterion: Criterion
    outcome: Outcome
    measurement: Measurement | None
    reason: str
    detectable: float | None = None
    """A count criterion's detectable ratio (:mod:`evaluator.power`): the smallest true ratio
    it would NO-GO by the horizon with 90 % probability at the pace of events so far."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "criterion": self.criterion.to_dict(),
            "outcome": str(self.outcome),
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "reason": self.reason,
            "detectable_ratio": self.detectable,
        }


@dataclass(frozen=True)
class Verdict:
    """The overall decision, every criterion's result and the data checks."""

    decision: Decision
    results: tuple[CriterionResult, ...]
    data_checks: tuple[CriterionResult, ...]
    reason: str
    look: Look | None = None
    """The look within the policy's plan, and the level the intervals were judged at."""

    def counts(self) -> dict[str, int]:
        out = {str(o): 0 for o in Outcome}
        for r in self.results:
            out[str(r.outcome)] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": str(self.decision),
            "reason": self.reason,
            "counts": self.counts(),
            "criteria": [r.to_dict() for r in self.results],
            "data_checks": [r.to_dict() for r in self.data_checks],
            "look": None if self.look is None else self.look.to_dict(),
        }


def fmt(value: float | None, unit: str = "") -> str:
    """A figure for people: 4 significant digits, percent for shares."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if unit == "share":
        return f"{value * 100:.3g} %"
    if unit == "count":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.4g}"
    return f"{value:.4g}"


def _interval_text(m: Measurement) -> str:
    if m.interval is None:
        return ""
    level = f"{level_text(m.interval.level)} "
    return f"{level}interval {fmt(m.interval.low, m.unit)} .. {fmt(m.interval.high, m.unit)}"


def _finite(x: float) -> bool:
    return not math.isnan(x)


def at_level(m: Measurement, level: float) -> Measurement:
    """``m`` with its interval restated at ``level`` by a normal approximation about its value:
    each side's distance scaled by ``z(level) / z(its level)``, on the log scale when the value
    and both bounds are positive and finite (ratios, rates). Unchanged without an interval or
    a value, or already at ``level``."""
    iv = m.interval
    if iv is None or m.value is None or abs(iv.level - level) < 1e-12:
        return m
    v = float(m.value)
    if math.isnan(v) or math.isnan(iv.low) or math.isnan(iv.high) or not 0 < iv.level < 1:
        return m
    k = z_of(level) / z_of(iv.level)
    if v > 0 and iv.low > 0 and math.isfinite(iv.high):
        lv = math.log(v)
        low = math.exp(lv - max(0.0, lv - math.log(iv.low)) * k)
        high = math.exp(lv + max(0.0, math.log(iv.high) - lv) * k)
    else:
        low = v - max(0.0, v - iv.low) * k if math.isfinite(iv.low) else iv.low
        high = v + max(0.0, iv.high - v) * k if math.isfinite(iv.high) else iv.high
    return replace(m, interval=Interval(low, high, level))


def restated(m: Measurement, level: float) -> Measurement:
    """``m`` with its interval at ``level``: recomputed by its own method when the measurement
    carries it (``Measurement.restate``: the exact or score interval of its counts, as the
    look's level was computed), else by the normal approximation (:func:`at_level`). At zero
    or few events the two differ most: a normal restatement of an exact bound about an
    estimate of 0 keeps the bound's skew at every level and is conservative."""
    iv = m.interval
    if iv is None or m.value is None or abs(iv.level - level) < 1e-12:
        return m
    if m.restate is not None:
        own = m.restate(level)
        if own is not None and _finite(own.low) and _finite(own.high):
            return replace(m, interval=own)
    return at_level(m, level)


def _widened(m: Measurement | None, look: Look | None) -> tuple[Measurement | None, str]:
    """``m`` at the look's level when it came at a lower one, and a note saying so."""
    if m is None or m.interval is None or look is None or m.interval.level >= look.level - 1e-12:
        return m, ""
    note = (
        f" (its {m.interval.level * 100:.3g} % interval widened to the look's level by"
        " normal approximation)"
    )
    return at_level(m, look.level), note


def _zero_budget(
    c: Criterion, m: Measurement, look: Look | None, rates: dict[str, Measurement]
) -> tuple[bool, str]:
    """Whether zero candidate events pass: the exact upper bound of the candidate's rate
    within the criterion's ``zero_budget``; the sentence either way."""
    if c.zero_budget is None:
        return False, "no zero_budget: zero events alone do not pass"
    rate = rates.get(c.rate_key or "")
    if rate is not None and rate.restate is not None and look is not None:
        # a PASS: the exact bound at the PASS side's own level (Policy.false_go), as every
        # other criterion's PASS; a rate without its method stays at the look's level
        pass_at = look.level if look.pass_level is None else min(look.pass_level, look.level)
        rate = restated(rate, pass_at)
    else:
        rate, _ = _widened(rate, look)
    if rate is None or rate.interval is None:
        return False, f"no {c.rate_key} to hold against the zero_budget {c.zero_budget:g}"
    bound = fmt(rate.interval.high)
    level = f"{rate.interval.level * 100:.3g} %"
    if rate.interval.high <= c.zero_budget:
        return True, (
            f"none on the candidate, and its rate's exact {level} upper bound {bound}"
            f" {rate.unit} is within the budget {c.zero_budget:g}"
        )
    return False, (
        f"none on the candidate yet, but its rate's exact {level} upper bound {bound}"
        f" {rate.unit} is above the budget {c.zero_budget:g}: too little exposure to pass on"
        " zero"
    )


def judge(
    criterion: Criterion,
    m: Measurement | None,
    look: Look | None = None,
    rates: dict[str, Measurement] | None = None,
) -> CriterionResult:
    """One criterion on its measurement (None when no analysis produced the key), at the
    ``look``'s level when given; ``rates``: the measurements by key (for ``zero_budget``)."""
    c = criterion
    thr = fmt(c.threshold, m.unit if m else "")
    widened = ""

    def result(outcome: Outcome, reason: str) -> CriterionResult:
        return CriterionResult(c, outcome, m, reason + widened)

    if m is None:
        return result(
            Outcome.INCONCLUSIVE, f"no analysis produced {c.key}: nothing to judge {c.text} on"
        )
    if m.inconclusive:
        return result(Outcome.INCONCLUSIVE, m.inconclusive)
    m, widened = _widened(m, look)
    assert m is not None
    zero_note = ""
    no_events = m.value is None and (m.n == 0 or m.interval is None or m.interval.low == 0)
    if c.pass_if_zero and (m.value == 0 or no_events):
        passes, zero_note = _zero_budget(c, m, look, rates or {})
        if passes:
            return result(Outcome.PASS, f"{zero_note} ({m.detail or m.key})".rstrip())
        zero_note = f"; {zero_note}"
    if m.value is None or (isinstance(m.value, float) and math.isnan(m.value)):
        return result(
            Outcome.INCONCLUSIVE, f"no value for {c.key} (n = {m.n}): too little data{zero_note}"
        )
    if m.n < c.min_n:
        return result(
            Outcome.INCONCLUSIVE,
            f"{fmt(m.value, m.unit)} from only n = {m.n}, fewer than the {c.min_n} required",
        )
    value = fmt(m.value, m.unit)
    if m.interval is None:
        if m.unit not in EXACT_UNITS:
            return result(
                Outcome.INCONCLUSIVE,
                f"{value} is a point estimate without an interval; it cannot decide {c.text}",
            )
        if c.good(m.value):
            return result(Outcome.PASS, f"observed {value}, within {c.op} {thr}")
        return result(Outcome.FAIL, f"observed {value}, beyond {c.op} {thr}")
    low, high = m.interval.low, m.interval.high
    if not (_finite(low) and _finite(high)):
        return result(Outcome.INCONCLUSIVE, f"{value} has no usable interval (NaN bounds)")
    span = _interval_text(m)
    # The PASS side's own boundary (Policy.false_go): the interval restated at the look's
    # pass level, never wider than the FAIL side's.
    good = m
    if (
        look is not None
        and look.pass_level is not None
        and look.pass_level < min(look.level, m.interval.level) - 1e-12
    ):
        good = restated(m, look.pass_level)
    assert good.interval is not None
    g_low, g_high = good.interval.low, good.interval.high
    g_span = _interval_text(good)
    if c.op == "<=":
        if g_high <= c.threshold:
            return result(Outcome.PASS, f"{value}, whole {g_span} at or below {thr}")
        if low > c.threshold:
            return result(Outcome.FAIL, f"{value}, whole {span} above {thr}")
    else:
        if g_low >= c.threshold:
            return result(Outcome.PASS, f"{value}, whole {g_span} at or above {thr}")
        if high < c.threshold:
            return result(Outcome.FAIL, f"{value}, whole {span} below {thr}")
    return result(
        Outcome.INCONCLUSIVE,
        f"{value}, but the {span} straddles {thr}: more data needed to decide{zero_note}",
    )


def _beyond(c: Criterion, m: Measurement | None) -> bool:
    """Whether ``m``'s interval lies wholly beyond ``c``'s threshold."""
    if m is None or m.interval is None:
        return False
    low, high = m.interval.low, m.interval.high
    if not (_finite(low) and _finite(high)):
        return False
    return low > c.threshold if c.op == "<=" else high < c.threshold


def _alert(r: CriterionResult, policy: Policy, days: float) -> CriterionResult:
    """A FAIL before ``min_days``, or an undecided criterion beyond its threshold at the
    policy's ``alert_level``, as an ALERT (shown, not a NO-GO)."""
    if r.outcome is Outcome.FAIL and days < policy.min_days:
        return replace(
            r,
            outcome=Outcome.ALERT,
            reason=(
                f"{r.reason}; only {days:.3g} of the policy's {policy.min_days:g} minimum days:"
                " an ALERT, not a NO-GO"
            ),
        )
    m = r.measurement
    if r.outcome is not Outcome.INCONCLUSIVE or m is None or m.interval is None:
        return r
    early = restated(m, policy.alert_level)
    if not _beyond(r.criterion, early):
        return r
    return replace(
        r,
        outcome=Outcome.ALERT,
        reason=(
            f"{r.reason}; beyond {fmt(r.criterion.threshold, m.unit)} at the alert level"
            f" ({_interval_text(early)}), not across the sequential boundary: an ALERT,"
            " not a NO-GO"
        ),
    )


def _with_power(r: CriterionResult, look: Look) -> CriterionResult:
    """A count criterion that did not FAIL, with what its data can detect in its reason
    (:mod:`evaluator.power`): an INCONCLUSIVE or a PASS on thin data says so."""
    if r.outcome is Outcome.FAIL:
        return r
    ratio, note = power_note(r.criterion, r.measurement, look)
    if not note:
        return r
    return replace(r, reason=f"{r.reason}; {note}", detectable=ratio)


def _data_check(
    key: str, minimum: float, by_key: dict[str, Measurement], what: str
) -> CriterionResult:
    c = Criterion(key=key, op=">=", threshold=float(minimum), why=f"the policy's minimum {what}")
    m = by_key.get(key)
    if m is None or m.value is None:
        return CriterionResult(
            c, Outcome.INCONCLUSIVE, m, f"the window's {what} are unknown (no {key} measurement)"
        )
    if m.value >= minimum:
        return CriterionResult(c, Outcome.PASS, m, f"{fmt(m.value)} {what}, at least {minimum:g}")
    return CriterionResult(
        c, Outcome.INCONCLUSIVE, m, f"only {fmt(m.value)} {what}; the policy asks for {minimum:g}"
    )


def decide(
    policy: Policy, measurements: Iterable[Measurement], look: Look | None = None
) -> Verdict:
    """Judge every criterion of ``policy`` at ``look``'s level and decide GO / NO-GO /
    INCONCLUSIVE. ``look``: the look within the plan, counted from the deployment's start
    (:func:`evaluator.review.build_review`); None: the look of the window's own ``data.days``.
    A look past the horizon says so in the reason (it spends nothing more)."""
    by_key: dict[str, Measurement] = {}
    for m in measurements:
        by_key.setdefault(m.key, m)
    days_m = by_key.get("data.days")
    days = float(days_m.value) if days_m is not None and days_m.value is not None else 0.0
    if look is None:
        look = policy.look(days)
    results = tuple(
        _with_power(_alert(judge(c, by_key.get(c.key), look, by_key), policy, days), look)
        for c in policy.criteria
    )
    checks = (
        _data_check("data.pairs", policy.min_pairs, by_key, "pairs"),
        _data_check("data.days", policy.min_days, by_key, "days"),
    )
    failed = [r for r in results if r.outcome is Outcome.FAIL]
    unsure = [r for r in results if r.outcome in (Outcome.INCONCLUSIVE, Outcome.ALERT)]
    alerts = [r for r in results if r.outcome is Outcome.ALERT]
    thin = [r for r in checks if r.outcome is not Outcome.PASS]
    at = f"look {look.look} of {look.looks}, intervals at {level_text(look.level)}"
    if look.past_horizon:
        at = look.horizon_text()
    if failed:
        names = ", ".join(r.criterion.text for r in failed)
        decision = Decision.NO_GO
        reason = (
            f"{len(failed)} criterion(s) failed, the sequential boundary crossed ({at}): {names}"
        )
    elif unsure or thin:
        parts = []
        if thin:
            parts.append("too little data (" + "; ".join(r.reason for r in thin) + ")")
        if alerts:
            parts.append(
                f"{len(alerts)} ALERT(s), not NO-GO: " + ", ".join(r.criterion.key for r in alerts)
            )
        undecided = [r for r in unsure if r.outcome is Outcome.INCONCLUSIVE]
        if undecided:
            parts.append(
                f"{len(undecided)} criterion(s) undecided: "
                + ", ".join(r.criterion.key for r in undecided)
            )
        if look.final and undecided:
            parts.append(
                "the planned horizon is passed: the plan is spent and the data did not resolve them"
                if look.past_horizon
                else "the planned horizon is reached: the data cannot resolve them"
            )
        decision, reason = Decision.INCONCLUSIVE, "; ".join(parts) + f" ({at})"
    else:
        decision = Decision.GO
        reason = (
            f"all {len(results)} criteria passed with their whole intervals on the good side"
            + (
                f" ({at})"
                if look.past_horizon
                else f" ({at}: intervals valid at every look of the plan)"
            )
        )
    return Verdict(decision, results, checks, reason, look)
