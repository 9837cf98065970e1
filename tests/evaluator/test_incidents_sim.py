"""Crash detection on what the real health sampler records from simulators, against the ledger."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from sqlalchemy import Engine

from evaluator.incidents import detect_incidents
from mirror.health import EngineTarget, HealthConfig, HealthSampler
from shadow_ab.records import HealthSample, Role
from simulator.ledger import summarize
from simulator.testing import RunningSim, running_pair
from storage.write import write_health

CANDIDATE = {"faults": [{"kind": "crash", "at_s": [240, 720], "restart_delay_s": 30}]}


class _Collect:
    def __init__(self) -> None:
        self.samples: list[HealthSample] = []

    def submit(self, record: Any) -> None:
        self.samples.append(record)


async def _sample(inc: RunningSim, cand: RunningSim, seconds: float) -> list[HealthSample]:
    sink = _Collect()
    targets = [
        EngineTarget("vllm@incumbent", Role.INCUMBENT, inc.base_url),
        EngineTarget("trtllm@candidate", Role.CANDIDATE, cand.base_url),
    ]
    async with aiohttp.ClientSession() as session:
        sampler = HealthSampler(
            targets, sink, session, "dep-sim", HealthConfig(interval_s=0.2, timeout_s=1.0)
        )
        task = asyncio.create_task(sampler.run())
        await asyncio.sleep(seconds)
        task.cancel()
    return sink.samples


@pytest.mark.slow
def test_sampled_crashes_match_the_ledger(sqlite_engine: Engine) -> None:
    # time_scale 60: crashes 4 s and 12 s (real) after start, each down while restarting.
    with running_pair(("vllm", "clean"), ("trtllm", CANDIDATE), time_scale=60) as (inc, cand):
        samples = asyncio.run(_sample(inc, cand, 20.0))
        injected = summarize(cand.ledger())
        clean = summarize(inc.ledger())
    crashes = [c for c in injected.of_kind("crash") if c.recovered_at is not None]
    assert len(crashes) == 2 and clean.incidents == []
    write_health(sqlite_engine, samples)
    lo = min(s.ts for s in samples)
    hi = max(s.ts for s in samples) + timedelta(seconds=1)
    found = detect_incidents(sqlite_engine, "dep-sim", (lo, hi))
    assert [(f.role, f.kind) for f in found] == [("candidate", "crash")] * len(crashes)
    for f in found:
        assert f.ended_at is not None and f.evidence["down_samples"] >= 1
