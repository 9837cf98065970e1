"""The verdict: each policy criterion judged on its measurement's interval, then GO / NO-GO /
INCONCLUSIVE overall, each with the statistic, its interval and a reason sentence.

Per criterion (``op`` ``<=``; ``>=`` mirrors it):

- **PASS** when the whole interval is on the good side (``high <= threshold``);
- **FAIL** when the whole interval is beyond the threshold (``low > threshold``);
- **INCONCLUSIVE** when the interval straddles the threshold, the measurement is missing or
  has no value, its sample ``n`` is below the criterion's ``min_n``, or it is an estimate that
  came without an interval (a point estimate alone never decides: that is how sparse error
  counts fool a judge). Observed counts (unit ``count``) are exact and judged on their value.

Sparse events: a criterion with ``pass_if_zero`` PASSes when nothing was seen (the value is 0,
or the ratio has no value because neither engine had an event: ``n`` 0, or the exact interval
of 0 vs 0 events, ``0 .. inf``).

Overall: **NO-GO** if any criterion FAILs; else **INCONCLUSIVE** if any is INCONCLUSIVE or the
window holds fewer pairs or days than the policy asks; else **GO**. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from evaluator.policy import Criterion, Policy
from evaluator.results import Measurement

EXACT_UNITS = frozenset({"count", "p-value"})
"""Units of figures that are observed, not estimated: judged on their value alone."""


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "criterion": self.criterion.to_dict(),
            "outcome": str(self.outcome),
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Verdict:
    """The overall decision, every criterion's result and the data checks."""

    decision: Decision
    results: tuple[CriterionResult, ...]
    data_checks: tuple[CriterionResult, ...]
    reason: str

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
    level = f"{m.interval.level * 100:.0f} % "
    return f"{level}interval {fmt(m.interval.low, m.unit)} .. {fmt(m.interval.high, m.unit)}"


def _finite(x: float) -> bool:
    return not math.isnan(x)


def judge(criterion: Criterion, m: Measurement | None) -> CriterionResult:
    """One criterion on its measurement (None when no analysis produced the key)."""
    c = criterion
    thr = fmt(c.threshold, m.unit if m else "")

    def result(outcome: Outcome, reason: str) -> CriterionResult:
        return CriterionResult(c, outcome, m, reason)

    if m is None:
        return result(
            Outcome.INCONCLUSIVE, f"no analysis produced {c.key}: nothing to judge {c.text} on"
        )
    if m.inconclusive:
        return result(Outcome.INCONCLUSIVE, m.inconclusive)
    no_events = m.value is None and (m.n == 0 or m.interval is None or m.interval.low == 0)
    if c.pass_if_zero and (m.value == 0 or no_events):
        seen = "no events on either engine" if m.value is None else "none on the candidate"
        return result(Outcome.PASS, f"{seen} in the window ({m.detail or m.key})".rstrip())
    if m.value is None or (isinstance(m.value, float) and math.isnan(m.value)):
        return result(Outcome.INCONCLUSIVE, f"no value for {c.key} (n = {m.n}): too little data")
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
    if c.op == "<=":
        if high <= c.threshold:
            return result(Outcome.PASS, f"{value}, whole {span} at or below {thr}")
        if low > c.threshold:
            return result(Outcome.FAIL, f"{value}, whole {span} above {thr}")
    else:
        if low >= c.threshold:
            return result(Outcome.PASS, f"{value}, whole {span} at or above {thr}")
        if high < c.threshold:
            return result(Outcome.FAIL, f"{value}, whole {span} below {thr}")
    return result(
        Outcome.INCONCLUSIVE,
        f"{value}, but the {span} straddles {thr}: more data needed to decide",
    )


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


def decide(policy: Policy, measurements: Iterable[Measurement]) -> Verdict:
    """Judge every criterion of ``policy`` and decide GO / NO-GO / INCONCLUSIVE."""
    by_key: dict[str, Measurement] = {}
    for m in measurements:
        by_key.setdefault(m.key, m)
    results = tuple(judge(c, by_key.get(c.key)) for c in policy.criteria)
    checks = (
        _data_check("data.pairs", policy.min_pairs, by_key, "pairs"),
        _data_check("data.days", policy.min_days, by_key, "days"),
    )
    failed = [r for r in results if r.outcome is Outcome.FAIL]
    unsure = [r for r in results if r.outcome is Outcome.INCONCLUSIVE]
    thin = [r for r in checks if r.outcome is not Outcome.PASS]
    if failed:
        names = ", ".join(r.criterion.text for r in failed)
        decision, reason = Decision.NO_GO, f"{len(failed)} criterion(s) failed: {names}"
    elif unsure or thin:
        parts = []
        if thin:
            parts.append("too little data (" + "; ".join(r.reason for r in thin) + ")")
        if unsure:
            parts.append(
                f"{len(unsure)} criterion(s) undecided: "
                + ", ".join(r.criterion.key for r in unsure)
            )
        decision, reason = Decision.INCONCLUSIVE, "; ".join(parts)
    else:
        decision = Decision.GO
        reason = f"all {len(results)} criteria passed with their whole intervals on the good side"
    return Verdict(decision, results, checks, reason)
