"""The health sampler: parsers on plain text, the sampler against simulator engines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from mirror_helpers import ListSink
from prometheus_client import REGISTRY

from mirror.health import (
    EngineTarget,
    Flavor,
    HealthConfig,
    HealthSampler,
    MetricsParseError,
    parse_trtllm_metrics,
    parse_vllm_metrics,
)
from shadow_ab.dev.processes import RunningSim, running_sim
from shadow_ab.records import HealthSample, Role

T = TypeVar("T")
FAST = {"latency": {"prefill_base_ms": 1, "decode_ms": 0.5}}


def run(fn: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            return await fn(session)

    return asyncio.run(main())


def sampler(
    session: aiohttp.ClientSession,
    sims: list[tuple[str, Role, RunningSim]],
    sink: ListSink,
    flavor: Flavor = "auto",
) -> HealthSampler:
    targets = [EngineTarget(name, role, sim.base_url, flavor) for name, role, sim in sims]
    return HealthSampler(
        targets, sink, session, "health-test", HealthConfig(interval_s=0.1, timeout_s=1.0)
    )


async def complete(session: aiohttp.ClientSession, sim: RunningSim, n: int = 3) -> None:
    for i in range(n):
        body = {"model": "sim-llama-3-8b-instruct", "prompt": f"hello {i}", "max_tokens": 8}
        async with session.post(sim.v1 + "/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()


# -- parsers ------------------------------------------------------------------------------------

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
vllm:num_requests_waiting{model_name="m",engine="0"} 1.0
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="0.1"} 4.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="+Inf"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m",engine="0"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m",engine="0"} 0.31
vllm:request_success_total{model_name="m",finished_reason="a } brace"} 7.0
vllm:request_success_created{model_name="m"} 1.7e9
process_start_time_seconds 1.79e+09
process_resident_memory_bytes 6.291456e+09
weird_nan NaN
"""


def test_parse_vllm_metrics_sums_series_and_skips_buckets() -> None:
    m = parse_vllm_metrics(VLLM_TEXT)
    assert m["vllm:num_requests_running"] == 5.0  # summed over engines
    assert m["vllm:num_requests_waiting"] == 1.0
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert m["vllm:time_to_first_token_seconds_count"] == 5.0
    assert m["vllm:request_success_total"] == 7.0
    assert m["process_start_time_seconds"] == 1.79e9
    assert m["process_resident_memory_bytes"] == 6.291456e9
    assert not any(k.endswith(("_bucket", "_created")) for k in m)
    assert "weird_nan" not in m


@pytest.mark.parametrize("text", ['vllm:x{a="1" 3.0\n', "vllm:x\n", "vllm:x{} abc\n"])
def test_parse_vllm_metrics_rejects_malformed_lines(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics(text)


def test_parse_trtllm_metrics_takes_the_newest_stat() -> None:
    stats: list[dict[str, Any]] = [
        {"iter": 7, "gpuMemUsage": 100, "numActiveRequests": 1},
        {
            "iter": 9,
            "gpuMemUsage": 300,
            "cpuMemUsage": 50,
            "numActiveRequests": 4,
            "numQueuedRequests": 2,
            "timestamp": "11-30-2026 06:00:00",
            "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 25, "cacheHitRate": 0.5},
        },
        {"iter": 8, "gpuMemUsage": 200},
    ]
    m = parse_trtllm_metrics(stats)
    assert m["iter"] == 9
    assert m["gpuMemUsage"] == 300
    assert m["numQueuedRequests"] == 2
    assert m["kvCacheStats.usedNumBlocks"] == 25
    assert m["kv_cache_usage"] == 0.25
    assert "timestamp" not in m
    assert parse_trtllm_metrics([]) == {}
    with pytest.raises(MetricsParseError):
        parse_trtllm_metrics({"not": "a list"})


# -- against the simulator ----------------------------------------------------------------------


def test_vllm_sample_then_version_change_then_crash_and_restart() -> None:
    """One vLLM engine through its life: parsed samples, a new version, a crash, a restart."""
    faults = {
        "faults": [
            # Seconds after the engine started serving: room for the first samples on a loaded
            # machine before anything happens.
            {"kind": "version_change", "at_s": [4.0], "to_version": "9.9.9"},
            {"kind": "crash", "at_s": [5.0], "restart_delay_s": 1.0},
        ]
    }
    sink = ListSink()
    key = {"engine": "vllm@inc", "role": "incumbent"}
    restarts_before = REGISTRY.get_sample_value("shadow_ab_engine_restarts_total", key) or 0.0
    with running_sim("vllm", "clean", overrides={**FAST, **faults}, ledger=False) as sim:

        async def go(session: aiohttp.ClientSession) -> tuple[HealthSampler, list[HealthSample]]:
            hs = sampler(session, [("vllm@inc", Role.INCUMBENT, sim)], sink)
            await complete(session, sim)
            first = await hs.sample_once()
            return hs, first + await _until(hs, _down_then_up)(session)

        hs, seen = run(go)
    s = seen[0]
    assert s.up and s.http_status == 200 and s.error is None
    assert s.flavor == "vllm"
    assert s.engine == "vllm@inc" and s.role is Role.INCUMBENT
    assert s.version and s.version != "9.9.9"
    assert s.process_start_time is not None and s.process_start_time > 1.7e9
    assert s.num_running == 0 and s.num_waiting == 0
    assert s.kv_cache_usage is not None
    assert s.cpu_mem_bytes is not None and s.cpu_mem_bytes > 0
    assert s.metrics["vllm:time_to_first_token_seconds_count"] == 3.0
    assert sink.records == seen

    ups = [x.up for x in seen]
    assert False in ups, "no down sample during the crash"
    assert ups[-1], "the engine did not come back"
    down = next(x for x in seen if not x.up)
    assert down.error is not None and "/health" in down.error
    assert len({x.process_start_time for x in seen if x.up}) == 2  # a new process
    assert hs.restarts("vllm@inc") == 1  # down-then-up and a new start time: one restart
    assert hs.version_changes("vllm@inc") == 1
    assert seen[-1].version == "9.9.9"
    after = REGISTRY.get_sample_value("shadow_ab_engine_restarts_total", key)
    assert after == restarts_before + 1.0
    assert REGISTRY.get_sample_value("shadow_ab_engine_up", key) == 1.0


def test_trtllm_keeps_last_values_when_drained_and_detects_a_crash() -> None:
    crash = {"faults": [{"kind": "crash", "at_s": [4.0], "restart_delay_s": 1.0}]}
    sink = ListSink()
    with running_sim("trtllm", "clean", overrides={**FAST, **crash}, ledger=False) as sim:

        async def go(session: aiohttp.ClientSession) -> tuple[HealthSampler, list[HealthSample]]:
            hs = sampler(session, [("trt@cand", Role.CANDIDATE, sim)], sink)
            await complete(session, sim)
            first = await hs.sample_once()
            second = await hs.sample_once()  # nothing stepped since: an empty list
            return hs, first + second + await _until(hs, _down_then_up)(session)

        hs, seen = run(go)
    first, second = seen[:2]
    assert first.flavor == "trtllm" and first.up
    assert first.gpu_mem_bytes is not None and first.gpu_mem_bytes > 0
    assert first.cpu_mem_bytes is not None and first.cpu_mem_bytes > 0
    assert first.kv_cache_usage is not None
    assert first.num_running is not None
    assert first.metrics["iter"] > 0
    assert second.gpu_mem_bytes == first.gpu_mem_bytes
    assert second.metrics == first.metrics

    ups = [x.up for x in seen]
    assert False in ups and ups[-1]
    assert hs.restarts("trt@cand") == 1
    assert seen[-1].process_start_time is None  # TensorRT-LLM does not report one


def test_vllm_multiprocess_and_health_503() -> None:
    """vLLM in multiprocess mode (no process_* metrics), its /health failing with 503."""
    overrides = {
        **FAST,
        "multiprocess": True,
        "faults": [{"kind": "error_burst", "at_s": [0.0], "duration_s": 600, "health_fails": True}],
    }
    with running_sim(
        "vllm", "clean", overrides=overrides, ledger=False, wait_for="listening"
    ) as sim:
        (s,) = run(
            lambda session: sampler(
                session, [("v@inc", Role.INCUMBENT, sim)], ListSink()
            ).sample_once()
        )
    assert not s.up
    assert s.http_status == 503
    assert s.error == "/health answered 503"
    assert s.flavor == "vllm"  # /metrics still answered: flavor and gauges are known
    assert s.num_running == 0
    assert s.process_start_time is None and s.cpu_mem_bytes is None
    assert s.version is not None


def test_unreachable_engine_is_a_down_sample() -> None:
    from shadow_ab.dev.processes import free_port

    target = EngineTarget("gone", Role.CANDIDATE, f"http://127.0.0.1:{free_port()}")

    async def go(session: aiohttp.ClientSession) -> list[HealthSample]:
        return await HealthSampler(
            [target], ListSink(), session, "health-test", HealthConfig(timeout_s=1.0)
        ).sample_once()

    (s,) = run(go)
    assert not s.up
    assert s.http_status is None
    assert s.error is not None and "/health" in s.error


def _down_then_up(seen: list[HealthSample]) -> bool:
    ups = [s.up for s in seen]
    return False in ups and ups[-1]


def _until(
    hs: HealthSampler, done: Callable[[list[HealthSample]], bool], timeout_s: float = 30.0
) -> Callable[[aiohttp.ClientSession], Awaitable[list[HealthSample]]]:
    async def go(_session: aiohttp.ClientSession) -> list[HealthSample]:
        seen: list[HealthSample] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done(seen):
            seen += await hs.sample_once()
            await asyncio.sleep(0.1)
        return seen

    return go


def test_run_samples_every_interval_until_cancelled() -> None:
    from shadow_ab.dev.processes import free_port

    sink = ListSink()
    target = EngineTarget("gone", Role.CANDIDATE, f"http://127.0.0.1:{free_port()}")

    async def go(session: aiohttp.ClientSession) -> bool:
        hs = HealthSampler(
            [target], sink, session, "health-test", HealthConfig(interval_s=0.05, timeout_s=0.5)
        )
        task = asyncio.create_task(hs.run())
        deadline = time.monotonic() + 30
        while len(sink.records) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert run(go)
    assert len(sink.records) >= 3
    assert all(isinstance(r, HealthSample) and not r.up for r in sink.records)
