"""analyze_latency end to end on a store: known speed-ups found with intervals, A/A stays
inside, warm-up left out and reported as cold start, goodput, measurement keys, JSON."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from latency_factories import T0, pairs
from sqlalchemy import Engine

from evaluator.latency import (
    METRICS,
    SLO,
    LatencyError,
    LatencySection,
    WarmupWindow,
    analyze_latency,
)
from evaluator.results import Measurement
from evaluator.rollups import refresh_rollups
from evaluator.stats import BootstrapConfig
from shadow_ab.records import ExchangeRecord
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

FAST = BootstrapConfig(n_resamples=299, pooled_resamples=99)
WINDOW = (T0, T0 + timedelta(hours=2))
NOW = T0 + timedelta(days=1)
STEP = timedelta(seconds=6)  # 1200 pairs in the window


def _write(engine: Engine, records: list[ExchangeRecord]) -> None:
    if engine.dialect.name == "postgresql":
        ensure_partitions(engine, T0, days_ahead=2)
    write_exchanges(engine, records)


def _m(section: LatencySection, key: str) -> Measurement:
    found = [m for m in section.measurements() if m.key == key]
    assert len(found) == 1, key
    return found[0]


def test_candidate_faster_ttft_found_with_interval(store: Engine) -> None:
    _write(store, pairs(1200, step=STEP, cand_ttft=0.8))
    section = analyze_latency(store, "dep-lat", WINDOW, config=FAST, now=NOW)
    for q in ("p50", "p95", "p99"):
        m = _m(section, f"latency.ttft.{q}.ratio")
        assert m.interval is not None and m.interval.contains(0.8), m
        assert m.interval.high < 1.0
        # TPOT unchanged (2 % per-pair noise): no material change either way
        tpot = _m(section, f"latency.tpot.{q}.ratio")
        assert tpot.interval is not None, tpot
        assert tpot.interval.low > 0.97 and tpot.interval.high < 1.03, tpot
    delta = _m(section, "latency.ttft.median_delta").interval
    assert delta is not None and delta.high < 0
    assert (_m(section, "latency.ttft.rank_test_p").value or 1.0) < 1e-6
    assert section.to_dict()["n"]["pairs"] == 1200


def test_a_a_never_claims_a_material_difference(sqlite_engine: Engine) -> None:
    """Every interval sits within 3 % of 1; a 95 % interval may miss 1 by chance (1 in 20), so
    most, not all, contain it."""
    _write(sqlite_engine, pairs(1200, step=STEP))
    section = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW)
    contain = []
    for metric in METRICS:
        for name in ("p50.ratio", "p95.ratio", "p99.ratio", "spread_ratio"):
            m = _m(section, f"latency.{metric}.{name}")
            assert m.interval is not None, m
            assert m.interval.low > 0.9 and m.interval.high < 1.1, m
            contain.append(m.interval.contains(1.0))
    assert sum(contain) >= 0.8 * len(contain)
    goodput = _m(section, "latency.goodput.delta")
    assert goodput.value == 0.0


def test_warmup_left_out_and_reported_as_cold_start(sqlite_engine: Engine) -> None:
    restart = T0 + timedelta(hours=1)
    records = []
    slow = 0
    for r in pairs(1200, step=STEP):  # the candidate's first 5 minutes after the restart
        if r.role.value == "candidate" and restart <= r.sent_at < restart + timedelta(minutes=5):
            ttft = (r.ttft_s or 0) * 20
            r = r.model_copy(update={"ttft_s": ttft, "e2e_s": (r.e2e_s or 0) + ttft})
            slow += 1
        records.append(r)
    _write(sqlite_engine, records)
    warm = [WarmupWindow("candidate", restart, restart + timedelta(minutes=5))]
    with_warmup = analyze_latency(
        sqlite_engine, "dep-lat", WINDOW, warmup=warm, config=FAST, now=NOW
    )
    p99 = _m(with_warmup, "latency.ttft.p99.ratio")
    assert p99.interval is not None and p99.interval.contains(1.0), p99
    body = with_warmup.to_dict()
    assert body["n"]["warmup_excluded"] == {"incumbent": 0, "candidate": slow}
    (cold,) = body["cold_start"]
    assert cold["role"] == "candidate"
    assert cold["median_first_ttft_s"] > 10 * cold["steady_ttft_p50_s"]
    assert 240 <= cold["time_to_normal_s"] <= 320  # back to normal at the 5-minute mark
    without = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW)
    assert (_m(without, "latency.ttft.p99.ratio").value or 0.0) > 2.0


def test_goodput_counts_failed_requests_as_not_good(sqlite_engine: Engine) -> None:
    _write(sqlite_engine, pairs(1200, step=STEP, cand_error_every=10))
    section = analyze_latency(
        sqlite_engine, "dep-lat", WINDOW, slo=SLO(ttft_s=1.0, tpot_s=0.1), config=FAST, now=NOW
    )
    m = _m(section, "latency.goodput.delta")
    assert m.value == pytest.approx(-0.1, abs=0.01)
    assert m.interval is not None and m.interval.high < 0
    goodput = section.to_dict()["goodput"]
    assert goodput["incumbent"]["share"] == 1.0


def test_every_key_and_a_json_body(sqlite_engine: Engine) -> None:
    _write(sqlite_engine, pairs(300, step=timedelta(seconds=30), cand_tpot=1.25))
    section = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW)
    keys = {m.key for m in section.measurements()}
    for metric in METRICS:
        for q in ("p50", "p95", "p99"):
            assert f"latency.{metric}.{q}.ratio" in keys
        for k in ("median_delta", "spread_ratio", "rank_test_p"):
            assert f"latency.{metric}.{k}" in keys
    assert "latency.goodput.delta" in keys
    assert not any(k.startswith("data.") for k in keys)  # the review's own (evaluator/review.py)
    body = json.loads(json.dumps(section.to_dict(), allow_nan=False))
    assert body["plots"]["cdf"]["ttft"]["candidate"]["probs"][-1] == 1.0
    assert body["plots"]["weekly_p95"]["e2e"]["incumbent"]["weeks"] == ["2026-W45"]
    assert {row["metric"] for row in body["overall"]} == set(METRICS)
    assert body["by_day"][0]["day"] == "2026-11-02"
    assert body["by_load"] and body["by_prompt_length"] and body["by_output_length"]
    itl = _m(section, "latency.itl.p50.ratio")
    assert itl.interval is not None and itl.interval.contains(1.25), itl


def test_bad_windows_are_refused(sqlite_engine: Engine) -> None:
    with pytest.raises(LatencyError):
        analyze_latency(sqlite_engine, "dep-lat", (WINDOW[1], WINDOW[0]))
    with pytest.raises(LatencyError):
        analyze_latency(
            sqlite_engine, "dep-lat", (T0.replace(tzinfo=None), WINDOW[1].replace(tzinfo=None))
        )


def test_no_data_gives_no_values_and_refresh_false_reads_rollups_as_they_are(
    sqlite_engine: Engine,
) -> None:
    empty = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW)
    ratio = _m(empty, "latency.ttft.p50.ratio")
    assert ratio.value is None and ratio.interval is None and ratio.n == 0
    _write(sqlite_engine, pairs(300, step=timedelta(seconds=20)))
    stale = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW, refresh=False)
    assert stale.to_dict()["n"]["pairs"] == 0  # the hours were rolled up (closed) while empty
    refresh_rollups(sqlite_engine, "dep-lat", WINDOW, now=NOW, recompute=True)
    fresh = analyze_latency(sqlite_engine, "dep-lat", WINDOW, config=FAST, now=NOW, refresh=False)
    assert fresh.to_dict()["n"]["pairs"] == 300
