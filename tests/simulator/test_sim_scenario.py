"""Scenario files: the shipped ones load, bad ones say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.scenario import (
    CrashFault,
    DriftFault,
    LeakFault,
    ScenarioError,
    load_scenario,
    resolve,
    shipped,
)


def test_shipped_scenarios_cover_the_issue() -> None:
    assert {"clean", "fast-crashy", "leaky", "drifty"} <= set(shipped())


@pytest.mark.parametrize("name", shipped())
@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
def test_every_shipped_scenario_loads_for_both_flavors(name: str, flavor: str) -> None:
    sc = load_scenario(name, flavor)  # type: ignore[arg-type]
    assert sc.flavor == flavor and sc.name == name


def test_shipped_scenarios_say_what_they_promise() -> None:
    clean = load_scenario("clean", "vllm")
    fast = load_scenario("fast-crashy", "trtllm")
    assert fast.latency.decode_ms == pytest.approx(clean.latency.decode_ms * 0.8)
    assert any(isinstance(f, CrashFault) for f in fast.faults)
    assert not clean.faults and clean.divergence.p == 0
    assert any(isinstance(f, LeakFault) for f in load_scenario("leaky", "trtllm").faults)
    drifty = load_scenario("drifty", "trtllm")
    assert drifty.divergence.p > 0 and any(isinstance(f, DriftFault) for f in drifty.faults)


def test_flavor_overrides_deep_merge() -> None:
    raw = {
        "latency": {"decode_ms": 8, "noise": 0.1},
        "flavors": {"trtllm": {"latency": {"decode_ms": 6}, "version": "1.2.0rc1"}},
    }
    t = resolve(raw, "trtllm")
    v = resolve(raw, "vllm")
    assert (t.latency.decode_ms, t.latency.noise, t.reported_version) == (6, 0.1, "1.2.0rc1")
    assert (v.latency.decode_ms, v.reported_version) == (8, "0.32.0")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"latncy": {}}, "unknown key(s) ['latncy']"),
        (
            {"latency": {"decod_ms": 1}},
            "latency.decod_ms: unknown key; allowed here: ['batch_slowdown'",
        ),
        ({"divergence": {"p": 1.5}}, "divergence.p: Input should be less than or equal to 1"),
        ({"faults": [{"kind": "explode"}]}, "does not match any of the expected tags: 'crash'"),
        ({"faults": [{"kind": "crash"}]}, "give exactly one of at_s"),
        ({"faults": [{"kind": "crash", "at_s": [1], "every_s": 5}]}, "give exactly one of at_s"),
        (
            {"faults": [{"kind": "leak", "mb_per_hour": 5, "rate": 1}]},
            "allowed here: ['kind', 'mb_per_hour'",
        ),
        ({"answers": {"min_tokens": 50, "max_tokens": 10}}, "answers.max_tokens must be >="),
        ({"flavors": {"sglang": {}}}, "'flavors' must map some of ['vllm', 'trtllm']"),
    ],
)
def test_errors_name_the_key_and_what_is_allowed(raw: dict, expected: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(raw, "vllm", "test.yaml")
    assert expected in str(exc.value)
    assert "test.yaml" in str(exc.value)


def test_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("latency: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad, "vllm")
    with pytest.raises(ScenarioError, match="shipped names"):
        load_scenario("no-such-scenario", "vllm")


def test_schedules_are_deterministic_and_rates_are_right() -> None:
    periodic = CrashFault(kind="crash", every_s=10, start_s=5, until_s=40)
    assert list(periodic.occurrences(1)) == [5, 15, 25, 35]
    fixed = CrashFault(kind="crash", at_s=[30, 10])
    assert list(fixed.occurrences(1)) == [10, 30]
    poisson = CrashFault(kind="crash", rate_per_hour=2, until_s=3600 * 5000)
    times = list(poisson.occurrences(42))
    assert times == list(poisson.occurrences(42))
    assert times != list(poisson.occurrences(43))
    # 10,000 expected; a Poisson count's sd is 100, so 5 sd either way.
    assert 9_500 <= len(times) <= 10_500
