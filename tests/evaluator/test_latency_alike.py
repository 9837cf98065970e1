"""Both engines measured alike, through a store (SQLite and PostgreSQL): failures counted as
the slowest, load parity (INCONCLUSIVE when the candidate ran at another concurrency), the
latency-vs-concurrency curve, and block intervals once the window holds enough hours."""

from __future__ import annotations

import json
from datetime import timedelta

from latency_factories import T0, pairs
from sqlalchemy import Engine

from evaluator.latency import LatencySection, VersionChange, WarmupWindow, analyze_latency
from evaluator.policy import Criterion
from evaluator.results import Measurement
from evaluator.stats import BootstrapConfig
from evaluator.verdict import Outcome, judge
from shadow_ab.records import ExchangeRecord
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

FAST = BootstrapConfig(n_resamples=199, pooled_resamples=49)
NOW = T0 + timedelta(days=3)


def _write(engine: Engine, records: list[ExchangeRecord]) -> None:
    if engine.dialect.name == "postgresql":
        ensure_partitions(engine, T0, days_ahead=3)
    write_exchanges(engine, records)


def _with(r: ExchangeRecord, **fields: object) -> ExchangeRecord:
    return ExchangeRecord.model_validate({**r.model_dump(), **fields})


def _m(section: LatencySection, key: str) -> Measurement:
    return next(m for m in section.measurements() if m.key == key)


def test_a_candidate_that_times_out_on_its_slowest_does_not_look_faster(store: Engine) -> None:
    records = pairs(1200, step=timedelta(seconds=6))
    inc_e2e = sorted(r.e2e_s or 0.0 for r in records if r.role == "incumbent")
    slow = inc_e2e[int(0.9 * len(inc_e2e))]
    out = []
    for r in records:
        if r.role == "candidate" and (r.e2e_s or 0.0) >= slow * 0.98:
            # the candidate fails on the slowest tenth: only its fast answers are "ok"
            r = _with(r, status="timeout", e2e_s=None, ttft_s=None, tpot_s=None, itl_s=[])
        out.append(r)
    _write(store, out)
    window = (T0, T0 + timedelta(hours=2))
    section = analyze_latency(store, "dep-lat", window, config=FAST, now=NOW)
    ok_only = _m(section, "latency.e2e.p95.ratio")
    with_failures = _m(section, "latency.e2e.p95.ratio_with_failures")
    assert ok_only.value is not None and with_failures.value is not None
    assert with_failures.interval is not None and with_failures.interval.low > 1.5
    assert with_failures.value > ok_only.value
    table = section.to_dict()["with_failures"]
    assert table[0]["failed"]["candidate"] > 50 and table[0]["failed"]["incumbent"] == 0


def test_candidate_at_a_tenth_of_the_concurrency_makes_latency_inconclusive(store: Engine) -> None:
    records = [
        _with(r, inflight_candidate=max(0, (r.inflight_incumbent or 0) // 10))
        for r in pairs(600, step=timedelta(seconds=12), cand_ttft=0.7)
    ]
    _write(store, records)
    section = analyze_latency(store, "dep-lat", (T0, T0 + timedelta(hours=2)), config=FAST, now=NOW)
    parity = section.to_dict()["load_parity"]
    assert parity["inflight_ratio"] is not None and parity["inflight_ratio"] < 0.2
    assert parity["shadow_share"] == 1.0 and parity["guard_states"]
    assert sum(b["pairs"] for b in section.to_dict()["load_parity_by_bucket"]) == 600
    m = _m(section, "latency.ttft.p95.ratio")
    assert "different concurrency" in m.inconclusive
    # the candidate is 30 % faster, but that was at a tenth of the load: not a verdict
    result = judge(Criterion("latency.ttft.p95.ratio", "<=", 1.10), m)
    assert result.outcome is Outcome.INCONCLUSIVE and "concurrency" in result.reason
    assert json.loads(json.dumps(section.to_dict()))["load_parity"]["inconclusive"]


def test_same_concurrency_is_judged_and_the_curve_has_intervals(store: Engine) -> None:
    _write(store, pairs(1200, step=timedelta(seconds=6), cand_ttft=0.8))
    section = analyze_latency(store, "dep-lat", (T0, T0 + timedelta(hours=2)), config=FAST, now=NOW)
    m = _m(section, "latency.ttft.p95.ratio")
    assert not m.inconclusive
    assert judge(Criterion("latency.ttft.p95.ratio", "<=", 1.10), m).outcome is Outcome.PASS
    curve = section.to_dict()["by_concurrency"]
    ttft = [row for row in curve if row["metric"] == "ttft"]
    assert len(ttft) >= 3
    for row in ttft:
        r = row["ratio"]["p95"]
        assert r["low"] <= 0.8 <= r["high"] or abs(r["value"] - 0.8) < 0.05, row


def test_a_day_of_pairs_gets_block_intervals(store: Engine) -> None:
    _write(store, pairs(1440, step=timedelta(seconds=60)))
    section = analyze_latency(store, "dep-lat", (T0, T0 + timedelta(days=1)), config=FAST, now=NOW)
    method = section.to_dict()["method"]["bootstrap"]
    assert method["unit"] == "blocks" and "whole UTC days resampled" in method["resampled"]
    assert "24 hour(s)" in method["resampled"]
    m = _m(section, "latency.ttft.p95.ratio")
    assert m.interval is not None and m.interval.contains(1.0)


def test_warm_up_is_left_out_until_latency_is_back_to_normal(store: Engine) -> None:
    restart = T0 + timedelta(minutes=30)
    slow_until = restart + timedelta(minutes=5)
    records = [
        _with(r, ttft_s=(r.ttft_s or 0.0) * 8)
        if r.role == "candidate" and restart <= r.sent_at < slow_until
        else r
        for r in pairs(1200, step=timedelta(seconds=6))
    ]
    _write(store, records)
    warmup = [WarmupWindow("candidate", restart, restart + timedelta(seconds=60))]
    section = analyze_latency(
        store, "dep-lat", (T0, T0 + timedelta(hours=2)), warmup=warmup, config=FAST, now=NOW
    )
    body = section.to_dict()
    cold = body["cold_start"][0]
    assert cold["time_to_normal_s"] is not None and 270 <= cold["time_to_normal_s"] <= 330
    # the 60 s window was stretched to the measured 5 minutes: ~50 slow exchanges left out
    assert 45 <= body["n"]["warmup_excluded"]["candidate"] <= 56
    m = _m(section, "latency.ttft.p99.ratio")
    assert m.interval is not None and m.interval.contains(1.0)


def test_the_latency_vs_concurrency_curve_is_plotted() -> None:
    from evaluator.render.plots import latency_vs_concurrency

    row = {
        "bucket": "4-7",
        "metric": "ttft",
        "n": 50,
        "incumbent": {"p50": 0.05, "p95": 0.1},
        "candidate": {"p50": 0.04, "p95": 0.08},
        "ratio": {"p95": {"value": 0.8, "low": 0.7, "high": None, "n": 50}},
    }
    svg = latency_vs_concurrency({"by_concurrency": [row, {**row, "bucket": "8-15"}]})
    assert svg is not None and "<svg" in svg
    assert latency_vs_concurrency({}) is None


def test_latency_before_and_after_an_upgrade(store: Engine) -> None:
    upgrade = T0 + timedelta(hours=1)
    records = [
        _with(r, ttft_s=(r.ttft_s or 0.0) * 1.5)
        if r.role == "candidate" and r.sent_at >= upgrade
        else r
        for r in pairs(1200, step=timedelta(seconds=6))
    ]
    _write(store, records)
    change = VersionChange("candidate", upgrade, "1.0", "1.1")
    section = analyze_latency(
        store,
        "dep-lat",
        (T0, T0 + timedelta(hours=2)),
        config=FAST,
        now=NOW,
        version_changes=[change],
    )
    row = section.to_dict()["upgrades"][0]
    assert (row["from_version"], row["to_version"]) == ("1.0", "1.1")
    ttft = {
        side: next(m for m in row[side]["metrics"] if m["metric"] == "ttft")
        for side in ("before", "after")
    }
    assert abs(ttft["before"]["ratio"]["p50"] - 1.0) < 0.05
    assert abs(ttft["after"]["ratio"]["p50"] - 1.5) < 0.08
