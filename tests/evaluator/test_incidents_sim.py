"""Incidents in what the real health sampler records from simulators, against their ledgers."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import aiohttp
import pytest
from sqlalchemy import Engine

from evaluator.incidents.analysis import detect_incidents
from evaluator.incidents.load import load_detection_input
from evaluator.incidents.model import IncidentConfig
from mirror.health import EngineTarget, HealthConfig, HealthSampler
from shadow_ab.dev.processes import RunningSim, running_pair
from shadow_ab.records import HealthSample, Record, Role
from simulator.ledger import summarize
from storage.write import write_health

CANDIDATE = {"faults": [{"kind": "crash", "at_s": [240, 720], "restart_delay_s": 30}]}
INCUMBENT = {"faults": [{"kind": "leak", "mb_per_hour": 150}]}  # vLLM: resident memory grows
SCALE = 60


class _Collect:
    """A record sink (mirror.sinks.RecordSink) that keeps the health samples in a list."""

    def __init__(self) -> None:
        self.samples: list[HealthSample] = []

    def submit(self, record: Record) -> bool:
        assert isinstance(record, HealthSample)
        self.samples.append(record)
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self, timeout: float = 30.0) -> bool:
        return True


async def _sample(inc: RunningSim, cand: RunningSim, seconds: float) -> list[HealthSample]:
    sink = _Collect()
    targets = [
        EngineTarget("vllm@incumbent", Role.INCUMBENT, inc.base_url),
        EngineTarget("trtllm@candidate", Role.CANDIDATE, cand.base_url),
    ]
    async with aiohttp.ClientSession() as session:
        sampler = HealthSampler(
            targets, sink, session, "dep-sim", HealthConfig(interval_s=0.2), timeout_s=1.0
        )
        task = asyncio.create_task(sampler.run())
        await asyncio.sleep(seconds)
        task.cancel()
    return sink.samples


@pytest.mark.slow
def test_sampled_crashes_and_leak_match_the_ledgers(sqlite_engine: Engine) -> None:
    # time_scale 60: the candidate crashes 4 s and 12 s (real) after start, each down while
    # restarting; the incumbent leaks 150 MB per simulated hour from the start.
    with running_pair(("vllm", INCUMBENT), ("trtllm", CANDIDATE), time_scale=SCALE) as (
        inc,
        cand,
    ):
        samples = asyncio.run(_sample(inc, cand, 20.0))
        injected = summarize(cand.ledger())
        leaking = summarize(inc.ledger())
    crashes = [c for c in injected.of_kind("crash") if c.recovered_at is not None]
    assert len(crashes) == 2 and [i.kind for i in leaking.incidents] == ["leak"]
    write_health(sqlite_engine, samples)
    lo = min(s.ts for s in samples)
    hi = max(s.ts for s in samples) + timedelta(seconds=1)
    # Real seconds: growth sustained for 10 s, stretches up to 20 s on a 1 s grid, 1 s bins, no
    # warm-up (the simulator's memory does not refill after a start).
    config = replace(
        IncidentConfig().for_time_scale(SCALE),
        leak_sustain_h=10 / 3600,
        leak_max_span_h=20 / 3600,
        leak_step_min=1 / 60,
        leak_warmup_min=0.0,
        leak_bin_s=1.0,
        leak_min_points=5,
    )
    found = detect_incidents(
        load_detection_input(sqlite_engine, "dep-sim", (lo, hi), config), config
    )
    assert sorted((f.role, f.kind) for f in found) == [
        *[("candidate", "crash")] * len(crashes),
        ("incumbent", "leak"),
    ]
    for f in found:
        if f.kind == "crash":
            assert f.ended_at is not None and f.evidence["down_samples"] >= 1
    leak = next(f for f in found if f.kind == "leak")
    assert leak.evidence["series"] == "cpu_mem_bytes"
    per_sim_hour = leak.evidence["mb_per_hour"] / SCALE
    assert per_sim_hour == pytest.approx(leaking.incidents[0].params["mb_per_hour"], rel=0.2)
