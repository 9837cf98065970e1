"""Hourly rollups on PostgreSQL and SQLite: sketches equal raw-row quantiles within the sketch's
accuracy, only unfinished hours are recomputed, partial edge hours and exclusions are exact."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pytest
from latency_factories import T0, pairs
from sqlalchemy import Engine, func, select

from evaluator.latency import group_sketches
from evaluator.rollups import (
    bucket_labels,
    load_sample,
    load_sketches,
    refresh_rollups,
)
from evaluator.sketch import RELATIVE_ACCURACY
from shadow_ab.records import ExchangeRecord
from storage.models import LatencyRollupHour, LatencySample
from storage.partitions import ensure_partitions
from storage.write import write_exchanges

QS = (0.5, 0.95, 0.99)
STEP = timedelta(seconds=15)  # 240 pairs an hour


def _write(engine: Engine, records: list[ExchangeRecord]) -> None:
    if engine.dialect.name == "postgresql":
        ensure_partitions(engine, T0, days_ahead=3)
    assert write_exchanges(engine, records) == len(records)


def _exact(
    records: list[ExchangeRecord],
    role: str,
    metric: str,
    lo: datetime = T0,
    hi: datetime | None = None,
) -> np.ndarray:
    out: list[float] = []
    for r in records:
        if r.role.value != role or r.status.value != "ok" or r.sent_at < lo:
            continue
        if hi is not None and r.sent_at >= hi:
            continue
        if metric == "itl":
            out += r.itl_s
        elif metric == "tokens_per_s":
            e2e, ttft = r.e2e_s, r.ttft_s
            if r.completion_tokens and e2e is not None and ttft is not None and e2e > ttft:
                out.append(r.completion_tokens / (e2e - ttft))
        else:
            v = getattr(r, f"{metric}_s")
            if v is not None:
                out.append(v)
    return np.sort(np.array(out))


def _close(est: float, values: np.ndarray, q: float) -> bool:
    exact = values[math.floor(q * (values.size - 1))]
    return abs(est - exact) <= RELATIVE_ACCURACY * exact * 1.0001


def test_sketches_equal_raw_quantiles_within_accuracy(store: Engine) -> None:
    records = pairs(720, step=STEP, cand_ttft=0.8, cand_error_every=7)  # 3 hours
    _write(store, records)
    window = (T0, T0 + timedelta(hours=3))
    result = refresh_rollups(store, "dep-lat", window, now=T0 + timedelta(days=1))
    assert (result.hours_computed, result.hours_skipped) == (3, 0)
    sketches = group_sketches(load_sketches(store, "dep-lat", window))
    for role in ("incumbent", "candidate"):
        for metric in ("ttft", "tpot", "itl", "e2e", "tokens_per_s"):
            sk = sketches[("all", "", role, metric, "all")]
            exact = _exact(records, role, metric)
            assert sk.count == exact.size
            for q, est in zip(QS, sk.quantiles(QS), strict=True):
                assert _close(est, exact, q), (role, metric, q)
            assert sk.mean == pytest.approx(float(exact.mean()))
    # a load bucket holds exactly the exchanges with that many requests in flight
    labels = bucket_labels((1, 2, 4, 8, 16, 32, 64))
    total = 0
    for i, _label in enumerate(labels):
        bucket = sketches.get(("all", "", "incumbent", "ttft", f"load:{i}"))
        total += bucket.count if bucket else 0
    assert total == _exact(records, "incumbent", "ttft").size
    four_to_seven = [
        r.ttft_s
        for r in records
        if r.role.value == "incumbent"
        and r.inflight_incumbent is not None
        and 4 <= r.inflight_incumbent < 8
    ]
    assert sketches[("all", "", "incumbent", "ttft", "load:3")].count == len(four_to_seven)
    day = sketches[("day", T0.date().isoformat(), "candidate", "e2e", "all")]
    assert day.count == _exact(records, "candidate", "e2e").size


def test_partial_edge_hours_and_exclusions_come_from_raw_rows(store: Engine) -> None:
    records = pairs(720, step=STEP)
    _write(store, records)
    refresh_rollups(store, "dep-lat", (T0, T0 + timedelta(hours=3)), now=T0 + timedelta(days=1))
    lo, hi = T0 + timedelta(minutes=20), T0 + timedelta(hours=2, minutes=40)
    warm = (T0 + timedelta(hours=1), T0 + timedelta(hours=1, minutes=10))
    rows = load_sketches(store, "dep-lat", (lo, hi), exclude={"candidate": [warm]})
    sketches = group_sketches(rows)
    inc = sketches[("all", "", "incumbent", "ttft", "all")]
    assert inc.count == _exact(records, "incumbent", "ttft", lo, hi).size
    cand = sketches[("all", "", "candidate", "ttft", "all")]
    kept = np.concatenate(
        [
            _exact(records, "candidate", "ttft", lo, warm[0]),
            _exact(records, "candidate", "ttft", warm[1], hi),
        ]
    )
    assert cand.count == kept.size
    kept.sort()
    for q, est in zip(QS, cand.quantiles(QS), strict=True):
        assert _close(est, kept, q)


def test_refresh_computes_only_unfinished_hours(store: Engine) -> None:
    _write(store, pairs(720, step=STEP))
    window = (T0, T0 + timedelta(hours=3))
    now = T0 + timedelta(hours=2, minutes=30)  # hours 0 and 1 closed, hour 2 open
    first = refresh_rollups(store, "dep-lat", window, now=now)
    assert (first.hours_computed, first.hours_skipped) == (3, 0)
    again = refresh_rollups(store, "dep-lat", window, now=now)
    assert (again.hours_computed, again.hours_skipped) == (1, 2)
    # late rows in the open hour are picked up by the next refresh
    late = pairs(4, start=T0 + timedelta(hours=2, minutes=59), step=timedelta(seconds=1), seed=9)
    _write(store, late)
    refresh_rollups(store, "dep-lat", window, now=now)
    with store.connect() as conn:
        hours = dict(
            conn.execute(
                select(LatencyRollupHour.closed, func.sum(LatencyRollupHour.n_pairs)).group_by(
                    LatencyRollupHour.closed
                )
            ).all()
        )
    assert {bool(k): int(v) for k, v in hours.items()} == {True: 480, False: 244}
    sketches = group_sketches(load_sketches(store, "dep-lat", window))
    assert sketches[("all", "", "incumbent", "e2e", "all")].count == 724


def test_sample_is_bounded_per_hour_and_proportional(store: Engine) -> None:
    records = pairs(720, step=STEP, cand_ttft=0.5)
    _write(store, records)
    window = (T0, T0 + timedelta(hours=3))
    refresh_rollups(store, "dep-lat", window, now=T0 + timedelta(days=1), sample_per_hour=100)
    with store.connect() as conn:
        per_hour = (
            conn.execute(
                select(func.count()).select_from(LatencySample).group_by(LatencySample.hour)
            )
            .scalars()
            .all()
        )
    assert sorted(per_hour) == [100, 100, 100]
    sample = load_sample(store, "dep-lat", window, target=150)
    assert len(sample) == 150  # 50 from each hour
    assert sample.n_pairs_total == 720
    inc = np.array(sample.columns["incumbent_ttft_s"])
    cand = np.array(sample.columns["candidate_ttft_s"])
    assert np.allclose(cand / inc, 0.5, rtol=0.1)  # the pairs line up
    assert len(set(sample.columns["pair_id"])) == 150
