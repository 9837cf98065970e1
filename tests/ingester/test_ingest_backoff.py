from __future__ import annotations

import random

import pytest

from ingester.backoff import Backoff


def test_nominal_delay_doubles_then_caps() -> None:
    b = Backoff(initial_s=0.1, cap_s=1.0, multiplier=2.0)
    assert [b.nominal(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.nominal(10_000) == 1.0  # no overflow after days of retrying


def test_jitter_stays_within_half_to_full_nominal() -> None:
    b = Backoff(initial_s=0.1, cap_s=5.0, rng=random.Random(7))
    for attempt in range(1, 12):
        nominal = b.nominal(attempt)
        delays = [b.delay(attempt) for _ in range(50)]
        assert all(nominal / 2 <= d <= nominal for d in delays)
        assert len(set(delays)) > 1  # jittered, not lock-step


def test_same_seed_same_delays() -> None:
    a = Backoff(rng=random.Random(3))
    b = Backoff(rng=random.Random(3))
    assert [a.delay(n) for n in range(1, 8)] == [b.delay(n) for n in range(1, 8)]


@pytest.mark.parametrize(("initial", "cap", "mult"), [(0, 1, 2), (2, 1, 2), (0.1, 1, 0.5)])
def test_bad_parameters_are_refused(initial: float, cap: float, mult: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(initial_s=initial, cap_s=cap, multiplier=mult)
    with pytest.raises(ValueError, match="counts from 1"):
        Backoff().nominal(0)
