"""Is the candidate faster? The latency section of the review.

:func:`analyze_latency` compares the candidate with the incumbent on TTFT, TPOT, ITL, E2E and
output tokens/s (timing definitions as vLLM's benchmark, see DESIGN.md), over one deployment
and window:

- quantiles p50/p95/p99 per role come from the hourly rollup sketches
  (:mod:`evaluator.rollups`, ~1 % relative accuracy), merged over the whole window, per UTC day,
  per ISO week and per load / prompt-length / output-length bucket, so a 30-day report never
  rescans the raw rows;
- ratios candidate/incumbent of each quantile, paired median deltas, the paired Wilcoxon
  signed-rank test, the spread ratio (p99 - p50) and goodput come from a bounded random sample of
  pairs (both roles ``ok``) that the rollups draw in SQL, with bootstrap intervals
  (:mod:`evaluator.stats`);
- only ``status = 'ok'`` exchanges count; exchanges sent during a :class:`WarmupWindow` (an
  engine (re)start, built by B2's ``evaluator.incidents.warmup_windows``) are left out, and the
  first requests after each restart are reported separately as cold-start times.

Errors: :class:`LatencyError` (bad arguments, such as a naive or empty window). Database errors
are SQLAlchemy's, as the store raises them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from evaluator.results import Measurement

Window = tuple[datetime, datetime]
Progress = Callable[[str, float], None]

METRICS = ("ttft", "tpot", "itl", "e2e", "tokens_per_s")
"""Metric names as in the measurement keys (evaluator/results.py)."""
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
ROLES = ("incumbent", "candidate")


class LatencyError(ValueError):
    """The latency analysis was asked something it cannot answer (bad window, unknown role)."""


@dataclass(frozen=True)
class WarmupWindow:
    """An engine warming up after a (re)start: ``role``'s exchanges sent in [start, end) are left
    out of the comparison and reported as cold-start time instead."""

    role: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput, as vLLM's benchmark ``--goodput ttft:..,tpot:..``:
    a request is good when it completed and every configured metric is <= its objective
    (seconds; None = not judged). TPOT of a one-token answer counts as 0, as vLLM does."""

    ttft_s: float | None = 0.5
    tpot_s: float | None = 0.05
    e2e_s: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}


@dataclass(frozen=True)
class LatencySection:
    """The latency comparison of one deployment over one window.

    ``to_dict()`` (JSON-able) holds::

        deployment, window {from, to}, slo, method (sketch accuracy, sample sizes, resamples),
        n {incumbent, candidate, pairs, pairs_sampled, warmup_excluded {role: count}},
        measurements  [Measurement.to_dict(), ...]
        overall       [{metric, role: {p50,p95,p99,n,mean}, ratio: {p50: {value, low, high}, ..},
                        median_delta {value, low, high}, spread_ratio {..}, rank_test_p}, ...]
        by_day        [{day: "YYYY-MM-DD", metric, incumbent {p50,p95,p99,n}, candidate {..},
                        ratio {p50,p95,p99}}, ...]
        by_week       same with week: "YYYY-Www"
        by_load, by_prompt_length, by_output_length
                      same with bucket: "lo-hi" (load = inflight_incumbent at dispatch)
        goodput       {slo, incumbent {good, n, share}, candidate {..}, delta {value,low,high}}
        cold_start    [{role, start, first_ttft_s [..], median_first_ttft_s, time_to_normal_s,
                        steady_ttft_p50_s}, ...]
        plots         {cdf: {metric: {role: {values: [..], probs: [..]}}},
                       weekly_p95: {metric: {role: {weeks: [..], values: [..]}}}}
        notes         [sentences: what was left out, how intervals were computed]
    """

    deployment: str
    window: Window
    slo: SLO
    measurement_list: tuple[Measurement, ...] = ()
    tables: dict[str, Any] = field(default_factory=dict)
    """overall, by_day, by_week, by_load, by_prompt_length, by_output_length, goodput,
    cold_start, n, method (see the class docstring)."""
    plots: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def measurements(self) -> list[Measurement]:
        return list(self.measurement_list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "window": {"from": self.window[0].isoformat(), "to": self.window[1].isoformat()},
            "slo": self.slo.to_dict(),
            "measurements": [m.to_dict() for m in self.measurement_list],
            **self.tables,
            "plots": self.plots,
            "notes": list(self.notes),
        }


def analyze_latency(
    engine: Engine,
    deployment: str,
    window: Window,
    *,
    warmup: Sequence[WarmupWindow] = (),
    slo: SLO = SLO(),
    progress: Progress | None = None,
) -> LatencySection:
    """The latency section of ``deployment`` over ``window`` (see the module docstring)."""
    raise NotImplementedError("analyze_latency: being built (B1)")
