"""The interference guard with an injected clock: AIMD, baselines, min samples, off-windows."""

from __future__ import annotations

import dataclasses
import json

import pytest
from prometheus_client import REGISTRY

from mirror.guard import GuardConfig, GuardTuning, InterferenceGuard, percentile


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def feed(
    guard: InterferenceGuard,
    clock: FakeClock,
    n: int,
    ttft: float,
    e2e: float,
    *,
    shadow: bool,
    every_s: float = 0.05,
) -> None:
    for _ in range(n):
        clock.advance(every_s)
        guard.observe(ttft, e2e, shadow)


_TUNING = {f.name for f in dataclasses.fields(GuardTuning)}


def config(**kw: object) -> tuple[GuardConfig, GuardTuning]:
    """Settings and tight tuning (the tuning's constants are for production traffic)."""
    base: dict[str, object] = {
        "min_samples": 20,
        "window_s": 10.0,
        "evaluate_interval_s": 0.0,
        "backoff_cooldown_s": 2.0,
        "recovery_interval_s": 5.0,
        "decrease_factor": 0.5,
        "increase_step": 0.1,
        "min_rate": 0.1,
        "bound": 0.25,
    }
    base.update(kw)
    tuning = GuardTuning(**{k: v for k, v in base.items() if k in _TUNING})  # type: ignore[arg-type]
    cfg = GuardConfig.model_validate({k: v for k, v in base.items() if k not in _TUNING})
    return cfg, tuning


def guard(clock: FakeClock, **kw: object) -> InterferenceGuard:
    cfg, tuning = config(**kw)
    return InterferenceGuard(cfg, clock, tuning)


def test_percentile() -> None:
    assert percentile([1.0], 0.95) == 1.0
    assert percentile([0.0, 10.0], 0.5) == 5.0
    assert percentile([float(i) for i in range(101)], 0.95) == pytest.approx(95.0)


def test_steady_while_latency_stays_at_the_baseline() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 200, 0.042, 0.205, shadow=True)  # within 25 %
    assert g.rate == 1.0
    assert g.state()["state"] == "steady"
    assert g.state()["ttft_baseline_s"] == pytest.approx(0.040)
    assert g.admit(0.99)


def test_backs_off_multiplicatively_under_degradation_with_cooldown() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)  # baseline, 5 s
    feed(g, clock, 20, 0.080, 0.200, shadow=True)  # TTFT p95 doubles: cut at min_samples
    assert g.rate == 0.5
    assert g.state()["state"] == "backoff"
    assert g.state()["degraded"] is True
    # Still degraded: the next cut waits for the cooldown and fresh samples.
    feed(g, clock, 25, 0.080, 0.200, shadow=True)  # 1.25 s: inside the 2 s cooldown
    assert g.rate == 0.5
    feed(g, clock, 40, 0.080, 0.200, shadow=True)
    assert g.rate == 0.25
    feed(g, clock, 200, 0.080, 0.200, shadow=True)
    assert g.rate == 0.1  # the floor
    assert g.cuts == 4
    # admit follows the rate: u below it passes, above it does not.
    assert g.admit(0.05)
    assert not g.admit(0.2)


def test_e2e_degradation_alone_backs_off() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 25, 0.040, 0.400, shadow=True)
    assert g.rate == 0.5


def test_recovers_additively_and_slowly() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 20, 0.080, 0.200, shadow=True)  # the cut comes with the 20th sample
    assert g.rate == 0.5
    # Healthy again: one step of 0.1 per 5 s, never faster.
    feed(g, clock, 99, 0.040, 0.200, shadow=True)  # 4.95 s
    assert g.rate == 0.5
    assert g.state()["state"] == "backoff"
    feed(g, clock, 2, 0.040, 0.200, shadow=True)
    assert g.rate == pytest.approx(0.6)
    assert g.state()["state"] == "recovering"
    feed(g, clock, 90, 0.040, 0.200, shadow=True)  # 4.5 s more
    assert g.rate == pytest.approx(0.6)
    feed(g, clock, 20, 0.040, 0.200, shadow=True)  # 5.5 s more
    assert g.rate == pytest.approx(0.7)
    feed(g, clock, 400, 0.040, 0.200, shadow=True)  # 20 s more: back at the ceiling
    assert g.rate == 1.0
    assert g.state()["state"] == "steady"
    assert g.raises == 5
    assert g.cuts == 1


def test_min_samples_respected() -> None:
    clock = FakeClock()
    g = guard(clock, min_samples=50)
    feed(g, clock, 49, 0.040, 0.200, shadow=False)  # a baseline of 49 is not yet a baseline
    feed(g, clock, 200, 0.500, 1.000, shadow=True)
    assert g.rate == 1.0
    assert g.state()["ttft_baseline_s"] is None

    clock2 = FakeClock()
    g2 = guard(clock2, min_samples=50)
    feed(g2, clock2, 100, 0.040, 0.200, shadow=False)
    feed(g2, clock2, 49, 0.500, 1.000, shadow=True)  # 49 watched samples: no judgement yet
    assert g2.rate == 1.0
    assert g2.state()["ttft_p95_s"] is None
    feed(g2, clock2, 1, 0.500, 1.000, shadow=True)
    assert g2.rate == 0.5


def test_judges_at_most_every_evaluate_interval() -> None:
    clock = FakeClock()
    g = guard(clock, evaluate_interval_s=1.0)
    for _ in range(30):
        g.observe(0.040, 0.200, False)  # judged with the first only
    clock.advance(1.0)
    g.observe(0.040, 0.200, False)  # judged: the baseline is known now
    assert g.state()["ttft_baseline_s"] == pytest.approx(0.040)
    clock.advance(0.5)
    for _ in range(25):
        g.observe(0.080, 0.200, True)  # enough to cut, but not judged within the second
    assert g.rate == 1.0
    clock.advance(0.5)
    g.observe(0.080, 0.200, True)
    assert g.rate == 0.5


def test_min_samples_counts_after_a_cut() -> None:
    """After a cut the window restarts: no second cut until min_samples fresh ones."""
    clock = FakeClock()
    g = guard(clock, min_samples=30, backoff_cooldown_s=0.0)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 30, 0.080, 0.200, shadow=True)
    assert g.rate == 0.5
    feed(g, clock, 29, 0.080, 0.200, shadow=True)
    assert g.rate == 0.5
    feed(g, clock, 11, 0.080, 0.200, shadow=True)
    assert g.rate == 0.25


def test_configured_baseline_needs_no_shadow_free_traffic() -> None:
    clock = FakeClock()
    g = guard(clock, baseline_ttft_s=0.040, baseline_e2e_s=0.200)
    feed(g, clock, 25, 0.070, 0.200, shadow=True)
    assert g.rate == 0.5
    assert g.state()["ttft_baseline_s"] == 0.040


def test_shadow_traffic_does_not_enter_the_baseline() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.500, 1.000, shadow=True)  # only shadowed traffic: no baseline
    assert g.state()["ttft_baseline_s"] is None
    assert g.rate == 1.0


def test_off_windows_admit_nothing_and_measure_the_baseline() -> None:
    clock = FakeClock()
    g = guard(clock, off_window_every_s=10.0, off_window_s=2.0)
    # 0..8 s: on, 8..10 s: off, 10..18 s: on ...
    clock.advance(1.0)
    assert g.admit(0.0)
    clock.advance(7.5)  # 8.5 s
    assert not g.admit(0.0)
    assert g.state()["state"] == "off_window"
    # In the window the incumbent runs alone: its latencies become the baseline.
    feed(g, clock, 25, 0.040, 0.200, shadow=False, every_s=0.05)  # 8.55 .. 9.75 s
    assert not g.admit(0.0)
    clock.advance(0.5)  # 10.25 s: a new period, shadowing on again
    assert g.admit(0.0)
    assert g.state()["state"] == "steady"
    assert g.state()["ttft_baseline_s"] == pytest.approx(0.040)
    admitted = 0
    for _ in range(200):  # the next 10 s: 80 % of the time on
        clock.advance(0.05)
        admitted += g.admit(0.0)
    assert 150 <= admitted <= 170


def test_disabled_guard_follows_max_rate_only() -> None:
    clock = FakeClock()
    g = guard(clock, enabled=False, max_rate=0.5, min_rate=0.1)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 100, 1.0, 5.0, shadow=True)
    assert g.admit(0.4)
    assert not g.admit(0.6)


def test_state_is_json_and_gauges_follow() -> None:
    clock = FakeClock()
    g = guard(clock)
    feed(g, clock, 100, 0.040, 0.200, shadow=False)
    feed(g, clock, 25, 0.080, 0.200, shadow=True)
    state = json.loads(json.dumps(g.state()))
    assert {"state", "rate", "ttft_p95_s", "e2e_p95_s", "ttft_baseline_s", "e2e_baseline_s"} <= (
        state.keys()
    )
    assert REGISTRY.get_sample_value("shadow_ab_mirror_guard_rate_ratio") == 0.5
    assert REGISTRY.get_sample_value("shadow_ab_mirror_guard_state", {"state": "backoff"}) == 1.0
    assert REGISTRY.get_sample_value("shadow_ab_mirror_guard_state", {"state": "steady"}) == 0.0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"min_rate": 0.6, "max_rate": 0.5}, "min_rate"),
        ({"off_window_every_s": 5.0, "off_window_s": 5.0}, "off_window_s"),
        ({"min_samples": 100, "max_samples": 50}, "min_samples"),
    ],
)
def test_config_validation(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        guard(FakeClock(), **kw)
