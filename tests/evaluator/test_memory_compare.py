"""The leak detector that compares engines: candidate minus incumbent memory growth.

Generated weeks of memory (tests/evaluator/memory_months.py: AR(1) noise with sd 50 MiB decaying
over 15 minutes, restarts, refills of 300 MiB - 6 GiB after each start, a daily cycle) for two
identical engines, and for a candidate that leaks through every process life.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from evaluator.incidents.leak import MB, LeakParams, excess_growth, growth
from evaluator.incidents.memory import KEY, compare_memory
from evaluator.incidents.model import HealthPoint, utc_at
from tests.evaluator.memory_months import MonthSpec, generate

SPEC = MonthSpec(days=7.0, daily_mb=30.0)
PARAMS = LeakParams()


def _leaking(month_t: np.ndarray, y: np.ndarray, starts: list[float], mb_h: float) -> np.ndarray:
    """``y`` plus ``mb_h`` MB/hour since the last process start, at every point."""
    idx = np.searchsorted(np.asarray(starts), month_t, side="right") - 1
    since_h = (month_t - np.asarray(starts)[idx]) / 3600.0
    return y + since_h * mb_h * MB


def _excess(seed: int, leak_mb_h: float = 0.0, level: float = 0.95) -> tuple[float, float, float]:
    inc = generate(SPEC, seed)
    cand = generate(SPEC, seed + 10_000)
    y = _leaking(cand.t, cand.y, cand.starts, leak_mb_h) if leak_mb_h else cand.y
    g_c = growth(cand.t, y, cand.starts, PARAMS)
    g_i = growth(inc.t, inc.y, inc.starts, PARAMS)
    assert g_c is not None and g_i is not None
    return excess_growth(g_c, g_i, level)


def test_identical_engines_excess_interval_covers_zero_near_its_level() -> None:
    seeds = 40
    covered = sum(low <= 0.0 <= high for _, low, high in (_excess(s) for s in range(seeds)))
    assert covered / seeds >= 0.85, covered
    # and the default policy's 20 MB/h is never crossed by a whole interval
    assert all(low <= 20.0 for _, low, _ in (_excess(s) for s in range(10)))


def test_a_leak_through_every_process_life_is_seen_as_excess() -> None:
    seeds = 20
    found = 0
    for seed in range(seeds):
        value, low, high = _excess(seed, leak_mb_h=50.0)
        assert low <= value <= high
        found += low > 20.0
        assert abs(value - 50.0) < 25.0, value
    assert found / seeds >= 0.9, found


def test_excess_interval_widens_with_the_level() -> None:
    _, lo95, hi95 = _excess(3, level=0.95)
    _, lo80, hi80 = _excess(3, level=0.80)
    assert lo95 < lo80 and hi80 < hi95


def _points(engine: str, role: str, t: np.ndarray, y: np.ndarray) -> list[HealthPoint]:
    return [
        HealthPoint(engine, role, utc_at(float(ti)), True, gpu_mem_bytes=int(yi))
        for ti, yi in zip(t, y, strict=True)
    ]


def test_compare_memory_measurement_and_levels_per_version() -> None:
    inc = generate(MonthSpec(days=2.0, restarts_per_day=0.0), 1)
    cand = generate(MonthSpec(days=2.0, restarts_per_day=0.0), 2)
    y_c = _leaking(cand.t, cand.y, cand.starts, 60.0)
    memory = {
        "vllm@incumbent": _points("vllm@incumbent", "incumbent", inc.t, inc.y),
        "trt@candidate": _points("trt@candidate", "candidate", cand.t, y_c),
    }
    upgrade = utc_at(float(cand.t[0])) + timedelta(days=1)
    health = {
        "vllm@incumbent": [
            HealthPoint("vllm@incumbent", "incumbent", utc_at(inc.t[0]), True, version="0.11.0")
        ],
        "trt@candidate": [
            HealthPoint("trt@candidate", "candidate", utc_at(cand.t[0]), True, version="1.0"),
            HealthPoint("trt@candidate", "candidate", upgrade, True, version="1.1"),
        ],
    }
    roles = {"vllm@incumbent": "incumbent", "trt@candidate": "candidate"}
    comp = compare_memory(memory, health, roles, {}, PARAMS)
    m = comp.measurement()
    assert m.key == KEY and m.unit == "MB/hour"
    assert m.value is not None and 45.0 < m.value < 75.0
    assert m.interval is not None and m.interval.low > 20.0 and m.interval.level == 0.95
    versions = {(r["role"], r["version"]) for r in comp.levels}
    assert versions == {("incumbent", "0.11.0"), ("candidate", "1.0"), ("candidate", "1.1")}
    c11 = next(r for r in comp.levels if r["version"] == "1.1")
    c10 = next(r for r in comp.levels if r["version"] == "1.0")
    # the leak keeps growing after the upgrade (no restart): higher level and peak
    assert c11["median_mb"] > c10["median_mb"] and c11["peak_mb"] >= c10["peak_mb"]
    assert comp.to_dict()["excess"]["gpu_mem_bytes"]["against"] == "gpu_mem_bytes"


def test_without_incumbent_memory_the_candidates_own_growth_is_judged() -> None:
    cand = generate(MonthSpec(days=1.0, restarts_per_day=0.0), 4)
    memory = {"c": _points("c", "candidate", cand.t, cand.y)}
    comp = compare_memory(memory, {}, {"c": "candidate"}, {}, PARAMS)
    m = comp.measurement()
    assert m.value is not None and m.interval is not None
    assert m.interval.low <= 0.0 <= m.interval.high
    assert "no memory" in m.detail
    empty = compare_memory({}, {}, {}, {}, PARAMS).measurement()
    assert empty.value is None and empty.interval is None
