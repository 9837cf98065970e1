"""Task quality (evaluator/quality.py) against the simulator's quality model: the probe accuracy's
interval holds the injected accuracy, a worse candidate (wrong probe answers, broken JSON) is
NO-GO on the probe and JSON criteria, a healthy one is not, and probes stay out of the client
figures."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from quality_factories import quality_pairs
from review_factories import T0, analyses
from sqlalchemy import Engine

from evaluator.policy import default_policy
from evaluator.quality import (
    QualityConfig,
    _pairs,
    analyze_quality,
    design_effect,
    paired_delta,
    probe_figures,
    traffic_figures,
)
from evaluator.render import render
from evaluator.review import build_review, data_extent
from evaluator.verdict import Outcome
from shadow_ab.probes import load_probe_set
from storage.write import write_exchanges

DEP = "dep-q"
HEALTHY = {"probe_accuracy": 0.9, "json_answers": True}
WORSE = {"probe_accuracy": 0.6, "broken_json": 0.5, "json_answers": True}


class _Row:
    def __init__(self, rec: Any) -> None:
        self.__dict__.update(
            pair_id=rec.pair_id,
            role=rec.role.value,
            sent_at=rec.sent_at,
            status=rec.status.value,
            output_text=rec.output_text,
            request=rec.request,
            probe_id=rec.probe_id,
        )


def test_the_interval_holds_the_injected_accuracy_over_seeds() -> None:
    """20 seeds of 300 probe pairs over 3 days: each engine's 95 % interval holds the accuracy
    the simulator was told (0.95 and 0.8), and the paired delta's holds -0.15, in at least 16
    of 20 (19 expected; fewer than 16 has a chance of 0.3 %); the ledger's realised accuracy
    is the point estimate exactly."""
    probes = load_probe_set()
    covered = {"incumbent": 0, "candidate": 0, "delta": 0}
    seeds = range(20)
    for seed in seeds:
        gen = quality_pairs(
            seed=seed,
            incumbent={"probe_accuracy": 0.95},
            candidate={"probe_accuracy": 0.8},
            probe_pairs=300,
            start=T0,
            days=3,
        )
        figures, ms = probe_figures(_pairs(_Row(r) for r in gen.records), probes, 0.95)
        by_key = {m.key: m for m in ms}
        for role, injected in (("incumbent", 0.95), ("candidate", 0.8)):
            m = by_key[f"quality.probe.{role}_accuracy"]
            assert m.interval is not None and m.n == 300
            covered[role] += m.interval.contains(injected)
            drawn = [line["correct"] for line in gen.ledger if line["role"] == role]
            assert m.value == pytest.approx(sum(drawn) / len(drawn))
        d = by_key["quality.probe.accuracy_delta"]
        assert d.interval is not None
        covered["delta"] += d.interval.contains(0.8 - 0.95)
        assert [row["day"] for row in figures["engines"]["candidate"]["by_day"]] == [
            "2026-11-02",
            "2026-11-03",
            "2026-11-04",
        ]
        assert figures["engines"]["candidate"]["by_week"]
    assert all(n >= 16 for n in covered.values()), covered


def test_clustered_probes_widen_the_interval() -> None:
    """A probe answered the same way every time it is asked (greedy decoding) is one unit, not
    many: the design effect grows the interval."""
    independent = [(i, i % 10 != 0) for i in range(1000)]
    clustered = [(i % 50, (i % 50) % 10 != 0) for i in range(1000)]  # 50 probes x 20 sends
    assert design_effect([(c, float(v)) for c, v in independent]) == pytest.approx(1.0, abs=0.1)
    assert design_effect([(c, float(v)) for c, v in clustered]) > 10
    _, wide, _ = paired_delta([(c, v, True) for c, v in clustered], 0.95)
    _, narrow, _ = paired_delta([(c, v, True) for c, v in independent], 0.95)
    assert wide is not None and narrow is not None
    assert wide.high - wide.low > 2 * (narrow.high - narrow.low)


def test_validity_and_refusal_count_all_traffic_against_the_incumbent() -> None:
    gen = quality_pairs(
        seed=1,
        incumbent={"json_answers": True},
        candidate={"json_answers": True, "broken_json": 0.3, "refusal": 0.1},
        probe_pairs=0,
        client_pairs=2000,
        json_share=0.2,
        start=T0,
        days=2,
    )
    js, rf, ms = traffic_figures(_pairs(_Row(r) for r in gen.records), 0.95)
    by_key = {m.key: m for m in ms}
    broken = [x for x in gen.ledger if x["event"] == "json" and x["role"] == "candidate"]
    assert js["delta"]["n"] == len(broken)
    v = by_key["quality.json.validity_delta"]
    assert v.interval is not None and v.interval.contains(-0.3) and v.interval.high < 0
    assert by_key["quality.json.incumbent_validity"].value == 1.0
    r = by_key["quality.refusal.rate_delta"]
    refusals = [x for x in gen.ledger if x["event"] == "refusal"]
    # refusals are drawn on the non-JSON answers (JSON answers are JSON)
    assert r.value == pytest.approx(len(refusals) / rf["delta"]["n"])
    assert r.interval is not None and r.interval.low > 0


def _review(engine: Engine, candidate: dict[str, Any], with_html: bool = False) -> Any:
    gen = quality_pairs(
        seed=7,
        incumbent=HEALTHY,
        candidate=candidate,
        probe_pairs=900,
        client_pairs=300,
        start=T0,
        days=3,
        deployment=DEP,
    )
    write_exchanges(engine, gen.records)
    run = dataclasses.replace(
        analyses(),
        quality=lambda e, d, w, **kw: analyze_quality(e, d, w, QualityConfig(), **kw),
    )
    policy = default_policy().with_minimums(min_pairs=100, min_days=3.0, horizon_days=3.0)
    review = build_review(
        engine,
        DEP,
        (T0, T0 + timedelta(days=3)),
        policy,
        analyses=run,
        store=False,
        with_html=with_html,
    )
    return review, {r.criterion.key: r for r in review.verdict.results}


def test_a_worse_candidate_is_no_go_on_probes_and_json(sqlite_engine: Engine) -> None:
    review, results = _review(sqlite_engine, WORSE, with_html=True)
    assert results["quality.probe.accuracy_delta"].outcome is Outcome.FAIL
    assert results["quality.json.validity_delta"].outcome is Outcome.FAIL
    assert review.decision == "NO-GO"
    # Probes are not client traffic: the window's pairs are the client's only.
    assert review.data["pairs"] == 300 == data_extent(sqlite_engine, DEP)["pairs"]
    quality = review.sections["quality"]
    assert quality["detail"]["probes"]["engines"]["candidate"]["overall"]["n"] == 900
    # The report shows the accuracy table per engine, window, week and day, with intervals.
    rows = quality["probe_accuracy"]
    assert {(r["engine"], r["period"]) for r in rows} >= {
        ("candidate", "window"),
        ("incumbent", "2026-11-03"),
        ("candidate", "2026-W45"),
    }
    html = review.html
    assert "quality: probe accuracy" in html and "quality: comparison" in html
    assert "JSON validity" in html and "refusal rate" in html
    md = render(review.to_dict(), "md")
    assert "### quality: probe accuracy" in md and "quality: detail" not in md


def test_a_healthy_candidate_is_not_no_go_on_quality(sqlite_engine: Engine) -> None:
    review, results = _review(sqlite_engine, HEALTHY)
    for key in (
        "quality.probe.accuracy_delta",
        "quality.json.validity_delta",
        "quality.refusal.rate_delta",
    ):
        assert results[key].outcome is not Outcome.FAIL, results[key].reason
    assert review.decision != "NO-GO", review.verdict.reason
