"""The health sampler: parsers on plain text, the sampler against simulator engines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from mirror_helpers import ListSink
from prometheus_client import REGISTRY

from mirror.health import (
    HEALTH_MAX_BYTES,
    METRICS_MAX_BYTES,
    EngineTarget,
    Flavor,
    HealthConfig,
    HealthSampler,
    MetricsParseError,
    detect_flavor,
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
        targets, sink, session, "health-test", HealthConfig(interval_s=0.1), timeout_s=1.0
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
    # a new process; an up sample can lack the start time: the crash came between its /health
    # and its /metrics (metrics_unreachable)
    starts = {x.process_start_time for x in seen if x.up and x.process_start_time is not None}
    assert len(starts) == 2
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
            [target], ListSink(), session, "health-test", HealthConfig(), timeout_s=1.0
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
            [target], sink, session, "health-test", HealthConfig(interval_s=0.05), timeout_s=0.5
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


# -- flavor detection and failed scrapes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "payload", "flavor"),
    [
        ("text/plain; version=1.0.0; charset=utf-8", b"# HELP x\n", "vllm"),  # real vLLM 0.32
        ("text/plain", b"", "vllm"),
        ("application/openmetrics-text", b"x 1\n", "vllm"),
        ("application/json", b"[]", "trtllm"),
        ("application/json", b"", "trtllm"),
        ("application/octet-stream", b' [{"iter": 3}]', "trtllm"),
        ("", b"vllm:num_requests_running 0.0\n", "vllm"),
        ("", b"process_start_time_seconds 1.7e9\n", "vllm"),
        ("", b"", None),
        ("text/html", b"<html>", None),
    ],
)
def test_detect_flavor(content_type: str, payload: bytes, flavor: str | None) -> None:
    assert detect_flavor(content_type, payload) == flavor


def failures(engine: str, reason: str, role: str = "candidate") -> float:
    labels = {"engine": engine, "role": role, "reason": reason}
    return REGISTRY.get_sample_value("shadow_ab_mirror_health_scrape_failures_total", labels) or 0


def scrape_logs(caplog: pytest.LogCaptureFixture, engine: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mirror.health" and f"engine {engine} " in r.getMessage()
    ]


def test_auto_flavor_reads_whichever_engine_serves_the_url() -> None:
    """The engine behind a URL changes kind (vLLM, then TensorRT-LLM on the same port): with
    flavor auto, the default, each is read as what it is, without an error (and no connection
    of the first engine is reused for the second)."""
    from shadow_ab.dev.processes import free_port

    port = free_port()
    target = EngineTarget("swap@cand", Role.CANDIDATE, f"http://127.0.0.1:{port}")
    assert target.flavor == "auto"

    async def once(session: aiohttp.ClientSession, hs: HealthSampler) -> HealthSample:
        (s,) = await hs.sample_once()
        return s

    async def go(session: aiohttp.ClientSession) -> list[HealthSample]:
        hs = HealthSampler([target], ListSink(), session, "health-test", HealthConfig())
        with running_sim("vllm", "clean", overrides=FAST, ledger=False, port=port) as sim:
            async with aiohttp.ClientSession() as client:
                await complete(client, sim)
            first = await once(session, hs)
        with running_sim("trtllm", "clean", overrides=FAST, ledger=False, port=port) as sim:
            async with aiohttp.ClientSession() as client:
                await complete(client, sim)
            second = await once(session, hs)
        return [first, second]

    first, second = run(go)
    assert (first.flavor, second.flavor) == ("vllm", "trtllm")
    assert first.error is None and second.error is None
    assert first.process_start_time is not None and first.num_running == 0
    assert second.gpu_mem_bytes is not None and second.metrics["iter"] > 0
    assert failures("swap@cand", "metrics_parse") == 0


def test_a_wrong_flavor_is_counted_logged_once_and_says_what_to_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first real run's failure: a vLLM candidate read as TensorRT-LLM. Every sample stores
    the error and is counted; the log says it once, with the setting that fixes it."""
    caplog.set_level(logging.INFO, logger="mirror.health")
    before = failures("wrong@cand", "metrics_parse")
    with running_sim("vllm", "clean", overrides=FAST, ledger=False) as sim:
        seen: list[HealthSample] = run(
            lambda session: _n_samples(
                sampler(session, [("wrong@cand", Role.CANDIDATE, sim)], ListSink(), "trtllm"), 3
            )
        )
    assert all(s.up and s.error is not None for s in seen)
    assert "set flavor: vllm or auto for engine wrong@cand" in (seen[0].error or "")
    assert all(s.flavor == "unknown" and s.num_running is None for s in seen)
    assert failures("wrong@cand", "metrics_parse") == before + 3
    (logged,) = scrape_logs(caplog, "wrong@cand")
    assert "failed" in logged and "metrics_parse" in logged and "set flavor: vllm" in logged


def test_an_unreachable_engine_is_logged_once_and_again_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shadow_ab.dev.processes import free_port

    caplog.set_level(logging.INFO, logger="mirror.health")
    port = free_port()
    target = EngineTarget("late@cand", Role.CANDIDATE, f"http://127.0.0.1:{port}")
    before = failures("late@cand", "health_unreachable")

    async def go(session: aiohttp.ClientSession) -> list[HealthSample]:
        hs = HealthSampler([target], ListSink(), session, "health-test", HealthConfig())
        seen = await _n_samples(hs, 3)
        with running_sim("vllm", "clean", overrides=FAST, ledger=False, port=port):
            seen += await _n_samples(hs, 2)
        return seen

    seen = run(go)
    assert [s.up for s in seen] == [False, False, False, True, True]
    assert seen[-1].error is None
    assert failures("late@cand", "health_unreachable") == before + 3
    assert failures("late@cand", "metrics_parse") == 0
    began, recovered = scrape_logs(caplog, "late@cand")
    assert "failed: /health:" in began and "health_unreachable" in began
    assert "works again after 3 failed samples" in recovered


async def _n_samples(hs: HealthSampler, n: int) -> list[HealthSample]:
    seen: list[HealthSample] = []
    for _ in range(n):
        seen += await hs.sample_once()
    return seen


def test_a_kept_alive_connection_the_engine_closes_is_not_a_down_sample() -> None:
    """An engine that closes an idle connection just as it is reused (uvicorn's 5 s keep-alive,
    under vLLM, against the default 5 s interval) must not read as an engine refusing
    connections, which detection takes for a crash: aiohttp asks again on a new connection
    (an idempotent GET on a reused one, RFC 9112 9.3.1). The stand-in answers one request per
    connection and drops the connection when a second request comes on it."""
    metrics = b"vllm:num_requests_running 0.0\nprocess_start_time_seconds 1.7e9\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1]
        body = {b"/version": b'{"version":"0.32.0"}', b"/metrics": metrics}.get(path, b"")
        kind = b"text/plain" if path == b"/metrics" else b"application/json"
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")  # a second request on this connection: drop it
        writer.close()

    async def go(session: aiohttp.ClientSession) -> list[HealthSample]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = EngineTarget("keep@inc", Role.INCUMBENT, f"http://127.0.0.1:{port}")
        async with server:
            hs = HealthSampler([target], ListSink(), session, "health-test", HealthConfig())
            return await _n_samples(hs, 3)

    seen = run(go)
    assert all(s.up and s.error is None for s in seen), [s.error for s in seen]
    assert [s.version for s in seen] == ["0.32.0"] * 3
    assert all(s.flavor == "vllm" and s.process_start_time == 1.7e9 for s in seen)


# -- hostile answers: an engine's /health, /version or /metrics too large to read (issue 26) ------


def _gzip_bomb(zeros: int) -> bytes:
    """``zeros`` zero bytes gzipped a megabyte at a time (~1 KB per MB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    mb = bytes(1024 * 1024)
    return b"".join([*(z.compress(mb) for _ in range(zeros // len(mb))), z.flush()])


HUGE = 64 * 1024 * 1024
"""A huge answer: 64 MiB of well-formed metric lines (or padding), sent whole."""


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        ("metrics-huge", "metrics_too_large"),
        ("metrics-bomb", "metrics_too_large"),
        ("health-huge", "health_too_large"),
        ("version-huge", "version_too_large"),
    ],
)
def test_an_answer_past_its_cap_is_not_read_and_is_a_failed_scrape(
    hostile: str, reason: str
) -> None:
    """An engine (outside the trust boundary) answering a scrape with more than its cap: the
    sampler reads no further (memory stays near the cap), stores a failed scrape saying why,
    and counts it; the engine still reads as up (its /health said 200)."""
    line = b"vllm:num_requests_running 1.0\n"
    metrics = b"process_start_time_seconds 1.7e9\n"
    version = b'{"version":"0.32.0"}'
    health = b""
    encoding = b""
    if hostile == "metrics-huge":
        metrics = line * (HUGE // len(line))
    elif hostile == "metrics-bomb":
        metrics, encoding = _gzip_bomb(200 * 1024 * 1024), b"content-encoding: gzip\r\n"
    elif hostile == "health-huge":
        health = b" " * HUGE
    else:
        version = b'{"version":"0.32.0","pad":"' + b" " * HUGE + b'"}'
    engine = f"{hostile}@cand"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                body = {b"/version": version, b"/metrics": metrics}.get(path, health)
                extra = encoding if path == b"/metrics" else b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n" + extra
                    + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
                )  # fmt: skip
                for i in range(0, len(body), 1024 * 1024):
                    writer.write(body[i : i + 1024 * 1024])
                    await writer.drain()
        writer.close()

    async def go(session: aiohttp.ClientSession) -> tuple[HealthSample, int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = EngineTarget(engine, Role.CANDIDATE, f"http://127.0.0.1:{port}")
        async with server:
            hs = HealthSampler(
                [target], ListSink(), session, "health-test", HealthConfig(), timeout_s=30.0
            )
            tracemalloc.start()
            try:
                (sample,) = await hs.sample_once()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            return sample, peak

    before = failures(engine, reason)
    sample, peak = run(go)
    assert failures(engine, reason) == before + 1
    assert peak < 3 * METRICS_MAX_BYTES, peak  # before: the whole answer, twice or more
    assert sample.up and sample.http_status == 200
    if reason == "version_too_large":
        assert sample.version is None and sample.error is None  # /version: counted only
    else:
        cap = METRICS_MAX_BYTES if reason == "metrics_too_large" else HEALTH_MAX_BYTES
        assert f"answered more than {cap} bytes" in (sample.error or ""), sample.error
