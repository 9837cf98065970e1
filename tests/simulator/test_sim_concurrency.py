"""200 concurrent streams held by one simulator on this machine, without errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from sim_helpers import FAST

from shadow_ab.dev.processes import http_get, running_sim

MODEL = "sim-llama-3-8b-instruct"
STREAMS = 200


async def _stream_all(base_url: str) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120)
    started = asyncio.Event()
    opened = 0

    async def one(i: int) -> dict[str, Any]:
        nonlocal opened
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"stream {i}"}],
            temperature=0,
            max_tokens=40,
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
        )
        text, pieces, usage, finish = "", 0, None, None
        async for chunk in stream:
            if pieces == 0 and chunk.choices and chunk.choices[0].delta.role:
                opened += 1
                if opened == STREAMS:
                    started.set()
                # Hold every stream open until all 200 are open at once.
                await asyncio.wait_for(started.wait(), timeout=60)
            usage = chunk.usage or usage
            for ch in chunk.choices:
                text += ch.delta.content or ""
                pieces += len(ch.logprobs.content or []) if ch.logprobs else 0
                finish = ch.finish_reason or finish
        return {"text": text, "pieces": pieces, "usage": usage, "finish": finish}

    try:
        return await asyncio.gather(*(one(i) for i in range(STREAMS)))
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["vllm", "trtllm"])
def test_200_concurrent_streams(flavor: str) -> None:
    overrides = {
        # 40 tokens at 25 ms: each stream lives about 1 s, long enough for all 200 to be open
        # at once even when the machine is busy (at 5 ms a loaded box finished some first)
        "latency": {**FAST["latency"], "decode_ms": 25.0},
        "answers": {"min_tokens": 50, "max_tokens": 80},
    }
    with running_sim(flavor, "clean", overrides=overrides) as sim:  # type: ignore[arg-type]
        results = asyncio.run(_stream_all(sim.v1))
        if flavor == "trtllm":
            stats = json.loads(http_get(sim.base_url + "/metrics")[1])
            peak = max(s["numActiveRequests"] + s["numQueuedRequests"] for s in stats)
        else:
            peak = None
    assert len(results) == STREAMS
    for r in results:
        assert r["usage"] is not None
        assert r["usage"].completion_tokens == r["pieces"] == 40
        assert r["finish"] == "length"
        assert r["text"]
    if peak is not None:
        assert peak == STREAMS  # all 200 were in the engine at once
