"""The probe figures' bounded sample (evaluator/quality.py, ``max_sends_per_probe``): at most so
many sends of each probe, evenly spread over its sends in time, every probe kept, the same sample
every time; the report says how many were read of how many."""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from quality_factories import quality_pairs
from review_factories import T0
from sqlalchemy import Engine

from evaluator.quality import QualityConfig, _load_probe_sample, analyze_quality, spread_sample
from storage.write import write_exchanges


def _month(probes: int = 300, days: int = 30, per_minute: float = 1.0) -> list[tuple]:
    """The mirror's probe sends: one every ``60 / per_minute`` s, the set in turn, jittered."""
    rng = random.Random(3)
    n = int(days * 1440 * per_minute)
    step = 86_400 / (1440 * per_minute)
    return [
        (
            uuid.UUID(int=rng.getrandbits(128)),
            T0 + timedelta(seconds=(k + rng.random()) * step),
            f"p{k % probes:03d}",
        )
        for k in range(n)
    ]


SENDS = _month()


def test_the_sample_is_bounded_and_keeps_every_probe() -> None:
    chosen = spread_sample(SENDS, 32)
    probe_of = {p: probe for p, _, probe in SENDS}
    per_probe = Counter(probe_of[p] for p in chosen)
    assert len(per_probe) == 300  # every probe represented
    assert set(per_probe.values()) == {32}  # 144 sends each, 32 kept
    assert len(chosen) == len(set(chosen)) == 300 * 32
    # a probe sent fewer times than the cap keeps every send
    few = [s for s in SENDS if s[2] == "p000"][:5] + [s for s in SENDS if s[2] == "p001"]
    kept = Counter(probe_of[p] for p in spread_sample(few, 32))
    assert kept == {"p000": 5, "p001": 32}


def test_the_sample_is_deterministic_whatever_the_order() -> None:
    shuffled = list(SENDS)
    random.Random(9).shuffle(shuffled)
    assert spread_sample(shuffled, 32) == spread_sample(SENDS, 32)
    assert spread_sample(SENDS, 7) != spread_sample(SENDS, 8)


@pytest.mark.parametrize("cap", [30, 10, 45])
def test_the_sample_is_spread_over_the_days(cap: int) -> None:
    """Every probe's kept sends cover the month evenly: with 30 kept of 144 one a day each; with
    10, no gap longer than 4 days; with 45, each day 1 or 2 per probe."""
    sent = {p: t for p, t, _ in SENDS}
    probe_of = {p: probe for p, _, probe in SENDS}
    days: dict[str, list[int]] = defaultdict(list)
    for p in spread_sample(SENDS, cap):
        days[probe_of[p]].append((sent[p] - T0) // timedelta(days=1))
    for probe, ds in days.items():
        assert ds == sorted(ds), probe  # each probe's ids come in time order
        assert ds[0] <= 30 // cap + 1 and ds[-1] >= 29 - 30 // cap - 1
        gaps = [b - a for a, b in itertools.pairwise(ds)]
        assert max(gaps) <= -(-30 // cap) + 1, (probe, ds)
        if cap == 30:
            assert ds == list(range(30))
        if cap == 45:
            assert set(Counter(ds).values()) <= {1, 2} and len(set(ds)) == 30


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        spread_sample(SENDS[:10], 0)


def test_the_review_reads_the_sample_and_says_how_many_of_how_many(
    sqlite_engine: Engine,
) -> None:
    """900 probe pairs over 3 days (each of the 300 probes drawn ~3 times), at most 2 sends a
    probe: every probe sent is read, none more than twice, the same figures on a second read,
    and the section and the measurement say how many were read of how many."""
    gen = quality_pairs(
        seed=5,
        incumbent={"probe_accuracy": 0.9},
        candidate={"probe_accuracy": 0.8},
        probe_pairs=900,
        client_pairs=0,
        start=T0,
        days=3,
        deployment="dep-qs",
    )
    write_exchanges(sqlite_engine, gen.records)
    sends = Counter(r.probe_id for r in gen.records if r.role.value == "candidate")
    expected = sum(min(2, n) for n in sends.values())
    window = (T0, T0 + timedelta(days=3))
    config = QualityConfig(max_sends_per_probe=2)
    pairs, total = _load_probe_sample(sqlite_engine, "dep-qs", window, 2)
    assert total == 900 and len(pairs) == expected < 900
    kept = Counter(p.sides["candidate"].probe_id for p in pairs.values())
    assert kept == {probe: min(2, n) for probe, n in sends.items()}  # every probe, at most 2
    assert all(set(p.sides) == {"incumbent", "candidate"} for p in pairs.values())
    first = analyze_quality(sqlite_engine, "dep-qs", window, config)
    again = analyze_quality(sqlite_engine, "dep-qs", window, config)
    assert first.probes["sample"] == {
        "pairs read": expected,
        "pairs": 900,
        "max sends per probe": 2,
    }
    assert first.measurements() == again.measurements()
    delta = next(m for m in first.measurements() if m.key == "quality.probe.accuracy_delta")
    assert delta.n == expected
    assert f"{expected:,} of the window's 900 probe pairs" in delta.detail
    assert f"{expected:,} of 900 probe pairs" in first.to_dict()["method"]["sample"]
    full = analyze_quality(sqlite_engine, "dep-qs", window, QualityConfig(max_sends_per_probe=None))
    assert full.probes["sample"]["pairs read"] == 900
    assert "every probe pair (900)" in full.to_dict()["method"]["sample"]
    assert next(m for m in full.measurements() if m.key == delta.key).n == 900
