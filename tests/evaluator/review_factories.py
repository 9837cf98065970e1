"""Hand-made analysis sections for the verdict, review and renderer tests (shaped as the
analyses' ``to_dict()`` documents them), and a seam to hand them to ``build_review``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from evaluator.results import Interval, Measurement
from evaluator.review import Analyses

T0 = datetime(2026, 11, 2, tzinfo=UTC)


@dataclass
class FakeSection:
    measurement_list: list[Measurement]
    body: dict[str, Any]
    findings: list[Any] = field(default_factory=list)

    def measurements(self) -> list[Measurement]:
        return list(self.measurement_list)

    def to_dict(self) -> dict[str, Any]:
        return {"measurements": [m.to_dict() for m in self.measurement_list], **self.body}


def _cdf(rng: np.random.Generator, scale: float) -> dict[str, list[float]]:
    values = np.sort(rng.lognormal(np.log(scale), 0.3, 200))
    return {"values": values.tolist(), "probs": (np.arange(1, 201) / 200).tolist()}


def latency_section(ratio: float = 1.0, slower_tail: bool = False) -> FakeSection:
    rng = np.random.default_rng(1)
    ms = []
    for metric in ("ttft", "tpot", "e2e"):
        ms.append(
            Measurement(
                f"latency.{metric}.p95.ratio",
                ratio,
                Interval(ratio - 0.03, ratio + 0.03),
                5000,
                "ratio",
                "bootstrap, 2000 resamples",
            )
        )
        spread = 1.6 if slower_tail else 1.0
        ms.append(
            Measurement(
                f"latency.{metric}.spread_ratio",
                spread,
                Interval(spread - 0.1, spread + 0.1),
                5000,
                "ratio",
            )
        )
    weeks = ["2026-W45", "2026-W46"]
    body = {
        "n": {"incumbent": 5000, "candidate": 5000, "pairs": 5000},
        "overall": [
            {
                "metric": "ttft",
                "incumbent": {"p50": 0.04, "p95": 0.08, "p99": 0.12, "n": 5000},
                "candidate": {"p50": 0.04, "p95": 0.08 * ratio, "p99": 0.12, "n": 5000},
                "ratio": {"p95": {"value": ratio, "low": ratio - 0.03, "high": ratio + 0.03}},
            }
        ],
        "by_day": [
            {
                "day": (T0 + timedelta(days=d)).date().isoformat(),
                "metric": "ttft",
                "incumbent": {"p95": 0.08},
                "candidate": {"p95": 0.08 * ratio},
            }
            for d in range(7)
        ],
        "by_week": [{"week": w, "metric": "ttft", "incumbent": {"p95": 0.08}} for w in weeks],
        "plots": {
            "cdf": {
                m: {"incumbent": _cdf(rng, s), "candidate": _cdf(rng, s * ratio)}
                for m, s in (("ttft", 0.04), ("tpot", 0.008), ("itl", 0.008), ("e2e", 0.6))
            },
            "weekly_p95": {
                m: {
                    "incumbent": {"weeks": weeks, "values": [s, s * 1.01]},
                    "candidate": {"weeks": weeks, "values": [s * ratio, s * ratio]},
                }
                for m, s in (("ttft", 0.08), ("tpot", 0.01), ("e2e", 1.0))
            },
        },
        "notes": ["warm-up after 2 restarts left out"],
    }
    return FakeSection(ms, body)


def incident_section(candidate_crashes: int = 0) -> FakeSection:
    ms = [
        Measurement("errors.rate_ratio", None, Interval(0.0, float("inf")), 0, "ratio"),
        Measurement(
            "incidents.crash.rate_ratio",
            float("inf") if candidate_crashes else None,
            Interval(0.4, float("inf")) if candidate_crashes else Interval(0, float("inf")),
            candidate_crashes,
            "ratio",
        ),
        Measurement("incidents.crash.candidate_count", candidate_crashes, None, 7, "count"),
        Measurement("incidents.hang.rate_ratio", None, Interval(0, float("inf")), 0, "ratio"),
        Measurement("incidents.leak.candidate_count", 0, None, 7, "count"),
        Measurement("incidents.leak.excess_mb_per_hour", 0.5, Interval(-3.0, 4.0), 100, "MB/hour"),
        # The candidate's own rates, bounded well within the default policy's zero budgets.
        Measurement("errors.candidate_rate", 0.0, Interval(0.0, 1e-4), 0, "per exchange"),
        Measurement("incidents.crash.candidate_rate", 0.0, Interval(0.0, 0.05), 0, "per day"),
        Measurement("incidents.hang.candidate_rate", 0.0, Interval(0.0, 0.05), 0, "per day"),
    ]
    timeline = [
        {
            "engine": "trtllm@candidate",
            "role": "candidate",
            "kind": "crash",
            "started_at": (T0 + timedelta(days=1 + i)).isoformat(),
            "ended_at": (T0 + timedelta(days=1 + i, minutes=1)).isoformat(),
        }
        for i in range(candidate_crashes)
    ]
    body = {
        "by_day": [{"day": "2026-11-03", "engine": "trtllm@candidate", "crash": candidate_crashes}],
        "timeline": timeline,
    }
    return FakeSection(ms, body)


def divergence_section(excess: float = 0.0) -> FakeSection:
    ms = [
        Measurement(
            "divergence.excess_rate",
            excess,
            Interval(excess - 0.005, excess + 0.005),
            4000,
            "share",
        ),
        Measurement(
            "divergence.hard_excess_rate",
            excess,
            Interval(excess - 0.005, excess + 0.005),
            4000,
            "share",
        ),
        Measurement(
            "divergence.finish_mismatch.excess", 0.0, Interval(-0.002, 0.002), 4000, "share"
        ),
        Measurement("divergence.length_shift", 0.0, Interval(-0.01, 0.01), 4000, "log ratio"),
    ]
    edges = [i / 10 for i in range(11)]
    body = {
        "candidate": {"pairs": 4000, "diverged": int(4000 * (0.01 + excess))},
        "histograms": {
            "edit_similarity": {
                "edges": edges,
                "candidate": [1, 0, 0, 2, 3, 5, 8, 10, 20, 3951],
                "replay": [0, 0, 0, 0, 1, 1, 2, 3, 5, 988],
            },
            "first_divergence": {
                "edges": [0, 1, 2, 4, 8, None],
                "candidate": [3, 5, 10, 20, 11],
                "replay": [0, 1, 2, 3, 4],
            },
        },
        "worst": [{"pair_id": "0f" * 16, "edit_similarity": 0.1}],
    }
    return FakeSection(ms, body)


def analyses(
    latency: FakeSection | None = None,
    incidents: FakeSection | None = None,
    divergence: FakeSection | None = None,
    calls: list[str] | None = None,
) -> Analyses:
    """An :class:`Analyses` returning these sections (recording the calls' order)."""
    log = calls if calls is not None else []

    def inc(*args: Any, **kw: Any) -> FakeSection:
        log.append("incidents")
        kw["progress"]("incidents", 0.5)
        return incidents or incident_section()

    def lat(*args: Any, **kw: Any) -> FakeSection:
        log.append(f"latency warmup={list(kw['warmup'])}")
        return latency or latency_section()

    def div(*args: Any, **kw: Any) -> FakeSection:
        log.append("divergence")
        return divergence or divergence_section()

    def warm(section: Any) -> list[str]:
        return [f"warmup-after-{f}" for f in section.findings]

    return Analyses(incidents=inc, warmup=warm, latency=lat, divergence=div)
