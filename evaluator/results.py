"""What the evaluator's analyses hand to the verdict and the report: plain, JSON-able values.

Each analysis (latency, incidents, divergence) returns a section object with

- ``measurements() -> list[Measurement]``: the figures a policy can put thresholds on, each under
  a stable dotted key (the policy file refers to these keys), with its interval and sample size;
- ``to_dict() -> dict``: everything the report shows (tables, series for plots), JSON-able.

Measurement keys (``<metric>`` in ttft, tpot, itl, e2e, tokens_per_s; ``<q>`` in p50, p95, p99;
``<kind>`` an incident kind in crash, leak, error_burst, hang, version_change)::

    latency.<metric>.<q>.ratio            candidate / incumbent quantile, bootstrap interval
    latency.<ttft|e2e>.<q>.ratio_with_failures
                                          the same ratio over every pair, a failed answer
                                          counted as the slowest, both roles censored at the
                                          shadow timeout
    latency.<metric>.median_delta         paired candidate - incumbent median delta (seconds)
    latency.<metric>.spread_ratio         candidate / incumbent (p99 - p50): a variance increase
                                          with the same median (a blind spot of Kayenta's judge)
    latency.<metric>.rank_test_p          paired Wilcoxon signed-rank p-value (no interval)
    latency.goodput.delta                 candidate - incumbent share of requests meeting the SLOs
    errors.rate_ratio                     candidate / incumbent share of failed exchanges, exact
                                          interval (sparse error counts: the other blind spot)
    incidents.<kind>.rate_ratio           candidate / incumbent incidents per day, exact
                                          conditional-binomial interval
    incidents.<kind>.candidate_count      candidate incidents in the window (interval None)
    incidents.leak.candidate_mb_per_hour  the candidate's steepest sustained memory slope
    incidents.leak.excess_mb_per_hour     candidate minus incumbent memory growth (MB/hour),
                                          every process life after its warm-up, interval
                                          widened for autocorrelated noise
    divergence.candidate_rate             share of candidate pairs that diverge
    divergence.noise_rate                 share of replay pairs that diverge (the noise floor)
    divergence.excess_rate                candidate_rate - noise_rate, with its interval
    divergence.edit_similarity.mean       mean normalized edit similarity of candidate pairs
    divergence.finish_mismatch.excess     finish-reason mismatch share over the noise floor
    divergence.json_invalid.excess        invalid-JSON share (when JSON was asked) over noise
    data.pairs / data.days                how much data the window holds (INCONCLUSIVE below
                                          the policy's minimums)
    divergence.semantic.excess            mean over triads (incumbent, candidate, replay of one
                                          request) of cos(replay, incumbent) - cos(candidate,
                                          incumbent), sentence embeddings (evaluator/semantic.py,
                                          extra shadow-ab[semantic]; without it INCONCLUSIVE)
    divergence.semantic.candidate_mean    mean cosine similarity of candidate to incumbent
    divergence.semantic.floor_mean        mean cosine similarity of replay to incumbent
    quality.probe.accuracy_delta          candidate minus incumbent accuracy on the mirror's
                                          probes both answered (evaluator/quality.py):
                                          Newcombe's paired interval on the effective n
                                          (clustered by probe: a probe asked again is
                                          answered alike)
    quality.probe.<candidate|incumbent>_accuracy
                                          each engine's probe accuracy, Wilson interval on the
                                          effective n
    quality.json.validity_delta           candidate minus incumbent share of valid JSON where
                                          the request asked JSON (parsed, and valid against the
                                          schema given), all traffic, paired, clustered by hour
    quality.json.<candidate|incumbent>_validity
    quality.refusal.rate_delta            candidate minus incumbent refusal rate, all traffic,
                                          paired, clustered by hour
    quality.refusal.<candidate|incumbent>_rate
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

Window = tuple[datetime, datetime]
"""A time window ``[start, end)`` an analysis looks at."""
Progress = Callable[[str, float], None]
"""``progress(stage, fraction done)``: how an analysis reports how far it is."""


@dataclass(frozen=True)
class Interval:
    """A confidence interval: ``low`` .. ``high`` at ``level`` (0.95 = 95 %)."""

    low: float
    high: float
    level: float = 0.95

    def __post_init__(self) -> None:
        if not (math.isnan(self.low) or math.isnan(self.high)) and self.low > self.high:
            raise ValueError(f"interval low {self.low} > high {self.high}")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high, "level": self.level}


@dataclass(frozen=True)
class Measurement:
    """One figure a policy criterion can judge: its value, interval and how much data."""

    key: str
    value: float | None
    """None when there was no data to compute it (the criterion is then INCONCLUSIVE)."""
    interval: Interval | None
    n: int
    """Sample size behind the value: pairs, exchanges, days or incidents, see ``unit``."""
    unit: str
    """Unit of ``value``: "ratio", "seconds", "share", "count", "MB/hour", "p-value", ..."""
    detail: str = ""
    """One sentence for people: how it was computed, what was left out."""
    inconclusive: str = ""
    """When set, why this measurement cannot decide anything (the verdict makes its criterion
    INCONCLUSIVE with this reason), e.g. the engines ran at different concurrencies."""
    restate: Callable[[float], Interval | None] | None = field(
        default=None, compare=False, repr=False
    )
    """The interval's own method at another level, when the analysis can give it: an exact or
    score interval recomputed from its counts (``RateComparison.interval_at``, Garwood,
    Newcombe). The verdict restates the interval at the PASS and ALERT levels with it; without
    it, by the normal approximation about the value. Not part of the JSON (a stored report
    keeps the intervals it was judged on); picklable (a bound method or a
    ``functools.partial`` of a module-level function), so measurements cross processes."""

    def to_dict(self) -> dict[str, Any]:
        out = {
            "key": self.key,
            "value": self.value,
            "interval": self.interval.to_dict() if self.interval else None,
            "n": self.n,
            "unit": self.unit,
            "detail": self.detail,
        }
        if self.inconclusive:
            out["inconclusive"] = self.inconclusive
        return out


class Section(Protocol):
    """One analysis' result, as the verdict and the report consume it."""

    def measurements(self) -> list[Measurement]: ...

    def to_dict(self) -> dict[str, Any]: ...
