"""The mirror's own overload (``overload:``, mirror/overload.py): the event loop's lag, measured
by a timer, scales shadowing down while it is high; every request turned away is counted
(``skipped_overload``) and named in its records, and the client's answers are untouched. The
mirror runs in-process against the fast simulator; its loop is made to lag by blocking it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from mirror_helpers import MODEL, ListSink, decisions, served_in_process

from mirror import metrics as m
from mirror.app import Mirror
from mirror.config import MirrorSettings, load_settings
from mirror.overload import LoopLag, OverloadConfig
from shadow_ab.dev.processes import RunningSim
from shadow_ab.records import ExchangeRecord, Role


def test_the_lag_maps_to_a_fraction_between_the_scaled_and_saturated_lags() -> None:
    lag = LoopLag(OverloadConfig(enabled=True), scaled_lag_ms=10, saturated_lag_ms=50)
    for late_ms, ratio in [(0, 1.0), (10, 1.0), (20, 0.75), (30, 0.5), (50, 0.0), (400, 0.0)]:
        fresh = LoopLag(lag.config, scaled_lag_ms=10, saturated_lag_ms=50)
        fresh.observe(100.0, late_ms / 1000)
        assert fresh.ratio == pytest.approx(ratio)
        assert fresh.admit_ratio == pytest.approx(ratio)
    # admit() compares the guard's draw with the fraction.
    half = LoopLag(lag.config, scaled_lag_ms=10, saturated_lag_ms=50)
    half.observe(0.0, 0.030)
    assert half.admit(0.49) and not half.admit(0.51)


def test_the_largest_lateness_of_the_window_counts_until_it_leaves_the_window() -> None:
    lag = LoopLag(OverloadConfig(enabled=True), window_s=1.0)
    lag.observe(10.0, 0.200)  # one stall
    for i in range(1, 10):  # calm ticks inside the window keep the stall's lag
        lag.observe(10.0 + i * 0.1, 0.001)
        assert lag.lag_s == pytest.approx(0.200)
        assert lag.admit_ratio == 0.0
    lag.observe(11.05, 0.002)  # the stall left the window: the largest since counts
    assert lag.lag_s == pytest.approx(0.002)
    assert lag.admit_ratio == 1.0
    # A smaller late tick is forgotten behind a larger later one, not before it.
    lag.observe(11.1, 0.030)
    lag.observe(11.2, 0.020)
    assert lag.lag_s == pytest.approx(0.030)
    lag.observe(12.15, 0.0)
    assert lag.lag_s == pytest.approx(0.020)


def test_disabled_it_measures_but_sheds_nothing() -> None:
    lag = LoopLag(OverloadConfig())
    assert lag.config.enabled is False  # off by default
    lag.observe(1.0, 0.5)
    assert lag.ratio == 0.0 and lag.lag_s == pytest.approx(0.5)
    assert lag.admit_ratio == 1.0 and lag.admit(0.999)


def test_the_timer_sees_a_blocked_loop_and_the_lag_clears_after_the_window() -> None:
    config = OverloadConfig(enabled=True)
    tight = {"interval_ms": 10, "window_s": 0.3, "scaled_lag_ms": 100, "saturated_lag_ms": 110}

    async def scenario() -> tuple[float, float, float]:
        lag = LoopLag(config, **tight)
        lag.start()
        try:
            await asyncio.sleep(0.05)
            time.sleep(0.35)  # the loop is held: the next tick fires ~0.34 s late
            await asyncio.sleep(0.03)
            blocked = (lag.lag_s, lag.admit_ratio)
            deadline = time.monotonic() + 10.0
            while lag.admit_ratio < 1.0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return blocked[0], blocked[1], lag.admit_ratio
        finally:
            lag.stop()

    lag_s, during, after = asyncio.run(scenario())
    assert lag_s >= 0.3
    assert during == 0.0
    assert after == 1.0


def test_saturated_must_exceed_scaled_and_the_error_names_both() -> None:
    with pytest.raises(ValueError, match=r"saturated_lag_ms.*scaled_lag_ms"):
        LoopLag(OverloadConfig(), scaled_lag_ms=50, saturated_lag_ms=20)


# -- the mirror ----------------------------------------------------------------------------------


def settings(pair: tuple[RunningSim, RunningSim], **overload: Any) -> MirrorSettings:
    inc, cand = pair
    return load_settings(
        None,
        incumbent={"url": inc.base_url},
        candidate={"url": cand.base_url},
        health_enabled=False,
        database_url="sqlite:///unused.db",
        guard={"enabled": False},
        shadow={"rate": 1.0},
        overload=overload,
    )


def lag_count() -> float:
    return next(
        s.value
        for metric in m.LOOP_LAG.collect()
        for s in metric.samples
        if s.name.endswith("_count")
    )


async def stall_then_ask(mirror: Mirror, n: int) -> list[str]:
    """Hold the mirror's loop for 0.3 s, then send ``n`` streamed chats; the streams' bodies."""
    bodies = []
    async with served_in_process(mirror) as client:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # anything holding the loop: the mirror cannot tell what
        await asyncio.sleep(0.05)  # the late tick runs
        for i in range(n):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": 8,
                "temperature": 0,
                "stream": True,
            }
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == 200
            bodies.append(resp.text)
    return bodies


def run(
    pair: tuple[RunningSim, RunningSim], **overload: Any
) -> tuple[list[str], Counter[str], list[ExchangeRecord]]:
    sink = ListSink()
    before = decisions()
    s = settings(pair, **overload)
    lag = LoopLag(s.overload, interval_ms=10, window_s=30.0)
    bodies = asyncio.run(stall_then_ask(Mirror(s, sink=sink, loop_lag=lag), 5))
    after = decisions()
    counted = Counter({k: int(after[k] - before.get(k, 0.0)) for k in after})
    records = [r for r in sink.records if isinstance(r, ExchangeRecord)]
    return bodies, +counted, records


def test_a_lagging_mirror_sheds_the_shadow_side_and_says_so(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    seen = lag_count()
    bodies, counted, records = run(engines, enabled=True)
    assert lag_count() > seen  # the timer ran and was observed
    # The client got whole answers.
    assert all(b.rstrip().endswith("data: [DONE]") for b in bodies)
    # Nothing shadowed: counted, and named in every incumbent record.
    assert counted == Counter({"skipped_overload": 5})
    assert [r.role for r in records] == [Role.INCUMBENT] * 5
    assert {r.guard["decision"] for r in records} == {"skipped_overload"}


def test_with_shedding_off_the_same_stall_sheds_nothing(
    engines: tuple[RunningSim, RunningSim],
) -> None:
    bodies, counted, records = run(engines, enabled=False)
    assert all(b.rstrip().endswith("data: [DONE]") for b in bodies)
    assert counted == Counter({"sampled": 5})
    roles = Counter(r.role for r in records)
    assert roles == Counter({Role.INCUMBENT: 5, Role.CANDIDATE: 5})
