"""The latency model and the scheduler: pure formulas, KV queueing, aborts."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import openai
import pytest
from sim_helpers import FAST

from shadow_ab.dev.processes import http_get, running_sim
from simulator.clock import SimClock
from simulator.engine import Engine, Job, Sequence
from simulator.faults import FaultRuntime
from simulator.generate import Completion, Token
from simulator.ledger import Ledger
from simulator.metrics import EngineStats
from simulator.scenario import Flavor, load_scenario

MODEL = "sim-llama-3-8b-instruct"


def _engine(flavor: Flavor = "vllm", **latency: float) -> Engine:
    sc = load_scenario(None, flavor, latency={"noise": 0.0, **latency})
    clock = SimClock(time.time())
    faults = FaultRuntime(
        sc, clock, Ledger(None, clock, flavor="vllm", engine="t"),
        process_start=0.0, resume_after=None, on_crash=lambda a, b, c: None,
    )  # fmt: skip
    return Engine(sc, faults, EngineStats())


def _job(prompt_tokens: int, out_tokens: int, n: int = 1) -> Job:
    tokens = [Token(1000, "x", 0.0)] * out_tokens
    seqs = [Sequence(Completion(tokens=list(tokens), finish_reason="stop")) for _ in range(n)]
    return Job(
        id="j",
        seqs=seqs,
        prompt_tokens=prompt_tokens,
        reserve_tokens=prompt_tokens + out_tokens * n,
    )


def test_iteration_time_formula() -> None:
    e = _engine(decode_ms=10, batch_slowdown=0.01, prefill_base_ms=5, prefill_per_token_ms=0.1)
    assert e.iteration_ms([]) == pytest.approx(10.0)
    small, big = _job(100, 10), _job(1000, 10)
    assert e.iteration_ms([small]) == pytest.approx(10 + 5 + 10)
    assert e.iteration_ms([big]) == pytest.approx(10 + 5 + 100)  # prefill grows with the prompt
    assert e.iteration_ms([small, big]) == pytest.approx(10 + 5 + 110)  # one batched prefill
    e.running = [_job(10, 10, n=51)]
    assert e.iteration_ms([]) == pytest.approx(10 * (1 + 0.01 * 50))  # batching slowdown


def test_warmup_after_start_slows_iterations() -> None:
    cold = _engine(decode_ms=10, warmup_s=3600, warmup_factor=2)
    assert cold.iteration_ms([]) == pytest.approx(20.0)
    warm = _engine(decode_ms=10, warmup_s=0.0, warmup_factor=2)
    assert warm.iteration_ms([]) == pytest.approx(10.0)


def test_kv_capacity_and_batch_limits_queue_requests() -> None:
    e = _engine(kv_capacity_tokens=300, max_num_seqs=4)
    jobs = [_job(50, 50) for _ in range(5)]  # each reserves 100 tokens
    for j in jobs:
        e.waiting.append(j)
    admitted = e._admit()
    assert admitted == jobs[:3] and len(e.waiting) == 2  # KV: 3 x 100 <= 300
    e2 = _engine(kv_capacity_tokens=10_000, max_num_seqs=4)
    wide = [_job(10, 10, n=3), _job(10, 10, n=2)]
    e2.waiting.extend(wide)
    assert e2._admit() == wide[:1]  # 3 + 2 sequences > 4
    e3 = _engine(kv_capacity_tokens=50)
    huge = _job(500, 500)
    e3.waiting.append(huge)
    assert e3._admit() == [huge]  # an idle engine takes even an oversized request


def test_engine_steps_to_completion() -> None:
    async def run() -> Engine:
        e = _engine("trtllm", decode_ms=0.1, prefill_base_ms=0.1)
        job = _job(10, 5, n=2)
        e.submit(job)
        task = asyncio.create_task(e.run())
        while not job.finished:
            await job.event.wait()
            job.event.clear()
        task.cancel()
        return e

    e = asyncio.run(run())
    assert e.stats.generation_tokens_total == 10
    assert e.stats.success == {"stop": 1, "length": 0, "abort": 0, "error": 0, "repetition": 0}
    assert e.kv_reserved == 0 and not e.running
    assert [s["iter"] for s in e.stats.iterations] == [1, 2, 3, 4, 5]  # TRT-LLM stats
    assert [s["numCompletedRequests"] for s in e.stats.iterations] == [0, 0, 0, 0, 1]


def test_queueing_visible_in_trtllm_stats() -> None:
    overrides = {
        "latency": {"decode_ms": 5, "prefill_base_ms": 1, "noise": 0.0, "kv_capacity_tokens": 400},
        "answers": {"min_tokens": 30, "max_tokens": 30},
    }
    with running_sim("trtllm", "clean", overrides=overrides) as sim:

        async def burst() -> list[int]:
            c = openai.AsyncOpenAI(base_url=sim.v1, api_key="x", max_retries=0)
            try:
                rs = await asyncio.gather(
                    *(
                        c.completions.create(
                            model=MODEL, prompt=f"p {i}", max_tokens=100, temperature=0
                        )
                        for i in range(8)
                    )
                )
            finally:
                await c.close()
            return [r.usage.completion_tokens for r in rs if r.usage]

        counts = asyncio.run(burst())
        stats = json.loads(http_get(sim.base_url + "/metrics")[1])
    assert counts == [30] * 8
    # Each request reserves 3 + 100 tokens: 3 fit in 400, the rest wait their turn.
    assert max(s["numActiveRequests"] for s in stats) == 3
    assert max(s["numQueuedRequests"] for s in stats) >= 1
    assert max(s["kvCacheStats"]["usedNumBlocks"] for s in stats) <= 400 // 16


def test_client_disconnect_aborts_the_request() -> None:
    overrides = {
        **FAST,
        "latency": {"decode_ms": 20, "noise": 0.0},
        "answers": {"min_tokens": 200, "max_tokens": 200},
    }
    with running_sim("vllm", "clean", overrides=overrides) as sim:
        body = json.dumps(
            {"model": MODEL, "prompt": "x", "max_tokens": 200, "stream": True}
        ).encode()
        req = urllib.request.Request(
            sim.v1 + "/completions", data=body, headers={"Content-Type": "application/json"}
        )
        resp = urllib.request.urlopen(req, timeout=10)
        assert resp.readline().startswith(b"data: ")
        resp.close()

        def metric(name: str) -> float:
            text = http_get(sim.base_url + "/metrics")[1].decode()
            line = next(ln for ln in text.splitlines() if ln.startswith(name))
            return float(line.rsplit(" ", 1)[1])

        deadline = time.monotonic() + 10
        while (
            metric(
                'vllm:request_success_total{engine="0",finished_reason="abort",'
                'model_name="sim-llama-3-8b-instruct"}'
            )
            < 1
        ):
            assert time.monotonic() < deadline, "the abort was never counted"
            time.sleep(0.05)
        assert metric("vllm:num_requests_running") == 0
