"""The review's cheaper computations give the very values of the straightforward ones.

The latency stage merges a month's sketch rows as columns, resamples the days of a month as
days (not as their hours) with the values sorted once, and reads the pair bootstrap's
quantiles from counts of the sorted values; each is checked here, bit for bit, against the
computation it replaced (kept below as the reference), on random data of many shapes.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from evaluator.blocks import (
    Blocks,
    GroupedQuantiles,
    blocks_from_keys,
    hour_weighted_quantiles,
    hour_weights,
    resample_units,
    unit_weights,
    weighted_quantiles_rows,
)
from evaluator.latency import group_sketches
from evaluator.rollups import SketchColumns, SketchRow, _int_lists
from evaluator.sketch import LogSketch
from evaluator.stats import (
    BootstrapConfig,
    _hour_weighted_paired_statistic,
    _paired_statistic,
    _resampled_paired_statistic,
    _unit_weighted_paired_statistic,
    paired_comparison,
)


def _month_blocks(rng: np.random.Generator, n: int, days: int) -> Blocks:
    keys = [
        (int(d), (int(d), int(h)))
        for d, h in zip(rng.integers(0, days, n), rng.integers(0, 24, n), strict=True)
    ]
    return blocks_from_keys(keys)


@pytest.mark.parametrize("days", [3, 8, 30])
def test_unit_weights_are_the_hour_weights_of_the_same_draws(days: int) -> None:
    rng = np.random.default_rng(days)
    blocks = _month_blocks(rng, 3000, days)
    unit_of, n_units = resample_units(blocks)
    by_unit = np.concatenate(list(unit_weights(blocks, 130, np.random.default_rng(5), 40)))
    by_hour = np.concatenate(list(hour_weights(blocks, 130, np.random.default_rng(5), 40)))
    assert by_unit.shape[1] == n_units == (blocks.n_days if days >= 7 else blocks.n_hours)
    assert np.array_equal(by_unit[:, unit_of], by_hour[:, blocks.hour_of])


@pytest.mark.parametrize("seed", range(6))
def test_grouped_quantiles_over_days_are_the_expanded_weighted_quantiles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    values = np.round(rng.lognormal(size=n), int(rng.integers(1, 4)))  # ties
    blocks = _month_blocks(rng, n, 30)
    unit_of, n_units = resample_units(blocks)
    w = np.concatenate(list(unit_weights(blocks, 60, rng)))
    qs = (0.5, 0.95, 0.99)
    expected = weighted_quantiles_rows(values, w[:, unit_of], qs)
    for step in (None, 1, 7, 64):
        got = GroupedQuantiles(values, unit_of, n_units, qs, step)(w)
        assert np.array_equal(got, expected, equal_nan=True)
    hw = np.concatenate(list(hour_weights(blocks, 20, rng)))
    assert np.array_equal(
        hour_weighted_quantiles(values, blocks, hw, qs),
        weighted_quantiles_rows(values, hw[:, blocks.hour_of], qs),
        equal_nan=True,
    )


@pytest.mark.parametrize("days", [2, 30])
def test_the_unit_weighted_paired_statistic_is_the_hour_weighted_one(days: int) -> None:
    rng = np.random.default_rng(days)
    blocks = _month_blocks(rng, 2500, days)
    a = rng.lognormal(size=2500)
    b = a * rng.lognormal(0.0, 0.2, size=2500)
    units = np.concatenate(list(unit_weights(blocks, 50, np.random.default_rng(1))))
    hours = np.concatenate(list(hour_weights(blocks, 50, np.random.default_rng(1))))
    fast = _unit_weighted_paired_statistic(a, b, blocks)(units)
    slow = _hour_weighted_paired_statistic(a, b, blocks, hours)
    assert np.array_equal(fast, slow, equal_nan=True)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 50, 51, 999])
def test_the_resampled_paired_statistic_is_numpys(n: int) -> None:
    rng = np.random.default_rng(n)
    a = np.round(rng.lognormal(size=n), 2)
    b = np.round(a * rng.lognormal(0.0, 0.3, size=n), 2)
    idx = rng.integers(0, n, size=(37, n))
    stat = _resampled_paired_statistic(a, b)
    assert np.array_equal(stat(idx), _paired_statistic(a[idx], b[idx]), equal_nan=True)
    assert np.array_equal(stat(idx[0]), _paired_statistic(a[idx[0]], b[idx[0]]), equal_nan=True)


def test_a_pair_bootstrap_keeps_its_intervals() -> None:
    # the statistic's values are numpy's, so the seeded intervals are those numpy gives
    rng = np.random.default_rng(3)
    a = rng.lognormal(size=300)
    b = a * 0.9
    comp = paired_comparison(a, b, BootstrapConfig(n_resamples=99))
    assert comp.ratios["p50"].low <= 0.9 + 1e-9 <= comp.ratios["p50"].high + 1e-9
    assert comp.n == 300


def test_taking_items_keeps_blocks_from_keys_order() -> None:
    rng = np.random.default_rng(11)
    blocks = _month_blocks(rng, 500, 30)  # more than 10 hours and days: text order differs
    idx = np.sort(rng.choice(500, size=200, replace=False))
    reference = blocks_from_keys(
        [(int(blocks.day_of_hour[h]), int(h)) for h in blocks.hour_of[idx]]
    )
    got = blocks.take(idx)
    assert np.array_equal(got.hour_of, reference.hour_of)
    assert np.array_equal(got.day_of_hour, reference.day_of_hour)


# -- sketch rows merged as columns ------------------------------------------------------------


def _reference_group(rows: list[SketchRow]) -> dict[Any, LogSketch]:
    """The row-by-row merge the vectorized one replaced."""
    accs: dict[Any, dict[str, Any]] = {}
    for r in rows:
        keys = [("all", "", r.role, r.metric, r.slice)]
        if r.slice == "all":
            year, week, _ = r.hour.isocalendar()
            keys.append(("day", r.hour.date().isoformat(), r.role, r.metric, "all"))
            keys.append(("week", f"{year}-W{week:02d}", r.role, r.metric, "all"))
        for k in keys:
            acc = accs.setdefault(
                k,
                {"keys": [], "counts": [], "zero": 0, "sum": 0.0, "lo": math.inf, "hi": -math.inf},
            )
            s = r.sign
            acc["keys"].extend(r.keys)
            acc["counts"].extend(r.counts if s > 0 else [-c for c in r.counts])
            acc["zero"] += s * r.zero_count
            acc["sum"] += s * r.sum
            if s > 0 and r.min is not None and r.max is not None:
                acc["lo"] = min(acc["lo"], r.min)
                acc["hi"] = max(acc["hi"], r.max)
    return {
        k: LogSketch.from_parts(
            [a["keys"]],
            [a["counts"]],
            zero_count=a["zero"],
            sum=a["sum"],
            min=a["lo"] if a["lo"] <= a["hi"] else None,
            max=a["hi"] if a["lo"] <= a["hi"] else None,
        )
        for k, a in accs.items()
    }


def _random_rows(rng: np.random.Generator, n: int, spread: int) -> list[SketchRow]:
    start = datetime(2026, 10, 1, tzinfo=UTC)
    rows = []
    for _ in range(n):
        m = int(rng.integers(0, 12))
        keys = sorted({int(k) for k in rng.integers(-spread, spread, m)})
        counts = [int(c) for c in rng.integers(1, 50, len(keys))]
        lo = None if rng.random() < 0.1 else float(rng.random())
        rows.append(
            SketchRow(
                start + timedelta(hours=int(rng.integers(0, 24 * 20))),
                str(rng.choice(["incumbent", "candidate"])),
                str(rng.choice(["ttft", "e2e"])),
                str(rng.choice(["all", "all", "load:1", "prompt:3"])),
                sum(counts),
                int(rng.integers(0, 3)),
                float(rng.random() * 100),
                lo,
                None if lo is None else lo + 1.0,
                keys,
                counts,
                -1 if rng.random() < 0.05 else 1,
            )
        )
    return rows


@pytest.mark.parametrize(("seed", "spread"), [(0, 40), (1, 300), (2, 2_000_000_000)])
def test_group_sketches_is_the_row_by_row_merge(seed: int, spread: int) -> None:
    # the widest range takes the sorting path instead of the dense table
    rows = _random_rows(np.random.default_rng(seed), 400, spread)
    got = group_sketches(rows)
    expected = _reference_group(rows)
    assert list(got) == list(expected)
    for k, sk in expected.items():
        g = got[k]
        assert np.array_equal(g.keys, sk.keys) and np.array_equal(g.counts, sk.counts)
        assert (g.zero_count, g.sum, g.min, g.max) == (sk.zero_count, sk.sum, sk.min, sk.max)
    columns = SketchColumns.from_rows(rows)
    assert columns.rows() == rows
    assert group_sketches(columns).keys() == got.keys()


def test_group_sketches_of_nothing() -> None:
    assert group_sketches([]) == {}


@pytest.mark.parametrize(
    "texts",
    [
        ["[1, 2, 3]", "[]", "[-4]", "[5,6]"],
        ["[]", "[]"],
        ["[ 1 ,2]", "[3]"],
        ["[1, 2.5]"],  # not integers: read value by value
        [[1, 2], [3]],  # lists already (a driver that parses JSON)
    ],
)
def test_int_lists_read_stored_bucket_lists(texts: list[Any]) -> None:
    lengths, flat = _int_lists(texts)
    if texts == ["[1, 2.5]"]:
        assert lengths.tolist() == [2] and flat.tolist() == [1, 2]
        return
    expected = [
        [
            int(x)
            for x in (
                t if isinstance(t, list) else t.strip("[] ").split(",") if t.strip("[] ") else []
            )
        ]
        for t in texts
    ]
    assert lengths.tolist() == [len(e) for e in expected]
    assert flat.tolist() == [x for e in expected for x in e]


# -- the quality sample reads the request fields that say whether JSON was asked --------------


@pytest.mark.parametrize("store", ["postgresql", "sqlite"], indirect=True)
def test_the_quality_sample_judges_json_as_the_whole_request_does(store: Any) -> None:
    from latency_factories import T0, pairs

    from evaluator.quality import _load_sample
    from shadow_ab.probes import json_asked
    from storage.partitions import ensure_partitions
    from storage.write import write_exchanges

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    asks: list[dict[str, Any]] = [
        {"model": "m", "messages": [{"role": "user", "content": "x" * 500}]},
        {"model": "m", "response_format": {"type": "json_object"}},
        {
            "model": "m",
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        },
        {"model": "m", "guided_json": schema},
        {"model": "m", "guided_json": None, "structured_outputs": {"json": '{"type": "object"}'}},
        {"model": "m", "response_format": None, "structured_outputs": None},
    ]
    records = pairs(len(asks) * 2, deployment="dep-quality-req")
    records = [
        r.model_copy(update={"request": asks[(i // 2) % len(asks)]}) if r.role == "incumbent" else r
        for i, r in enumerate(records)
    ]
    if store.dialect.name == "postgresql":
        ensure_partitions(store, T0, days_ahead=3)
    assert write_exchanges(store, records) == len(records)
    window = (T0, T0 + timedelta(days=1))
    sample = _load_sample(store, "dep-quality-req", window, 100, None)
    wanted = {r.pair_id: r.request for r in records if r.role == "incumbent"}
    assert set(sample) == set(wanted)
    for pid, pair in sample.items():
        assert json_asked(pair.sides["incumbent"].request) == json_asked(wanted[pid])
        assert pair.sides["candidate"].request == {}
