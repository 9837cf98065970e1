"""Synthetic records with every field filled in: the benchmarks' data and the tests' factories.

Deterministic for a given ``seed``: the same arguments give the same records, so a benchmark
and a test that build the same records see the same bytes. The text is drawn from a small
vocabulary (``text_of``), the timings around a fast engine's (TTFT ~40 ms, TPOT 8 ms).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from shadow_ab.records import ExchangeRecord, HealthSample, TokenLogprob

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
"""When synthetic records start, unless told otherwise."""

WORDS = tuple("the quick brown fox jumps over a lazy dog while engines stream tokens".split())


def engine_of(role: str) -> str:
    """The engine id a record of ``role`` carries, as the mirror names them: the candidate is
    TensorRT-LLM; the incumbent is vLLM, and so is a replay (the incumbent asked again)."""
    return "trtllm@candidate" if role == "candidate" else "vllm@incumbent"


def text_of(n_bytes: int, rng: random.Random, words: Sequence[str] = WORDS) -> str:
    """``n_bytes`` of space-separated words drawn from ``words``."""
    out: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_bytes]


def exchange(
    *,
    pair_id: uuid.UUID | None = None,
    role: str = "incumbent",
    sent_at: datetime = T0,
    deployment: str = "dep-a",
    text_bytes: int = 200,
    seed: int = 0,
    **overrides: Any,
) -> ExchangeRecord:
    """A successful streamed chat exchange with every field filled in: ``text_bytes`` of output
    and a quarter of that of prompt, timings, token counts, logprobs, rewrites (the candidate's
    model name), in-flight counts and the guard's state. ``overrides`` replace any field."""
    rng = random.Random(seed)
    fields: dict[str, Any] = {
        "deployment": deployment,
        "pair_id": pair_id or uuid.UUID(int=rng.getrandbits(128)),
        "role": role,
        "engine": engine_of(role),
        "endpoint": "chat",
        "stream": True,
        "model": "llama-3-8b",
        "sent_at": sent_at,
        "status": "ok",
        "http_status": 200,
        "ttft_s": 0.04 + rng.random() / 100,
        "e2e_s": 0.5 + rng.random(),
        "tpot_s": 0.008,
        "itl_s": [0.008 + rng.random() / 1000 for _ in range(8)],
        "prompt_tokens": 120,
        "completion_tokens": 64,
        "finish_reason": "stop",
        "request": {
            "model": "llama-3-8b",
            "messages": [{"role": "user", "content": text_of(text_bytes // 4, rng)}],
            "temperature": 0.0,
            "seed": 7,
            "max_tokens": 64,
        },
        "rewrites": ["model"] if role == "candidate" else [],
        "output_text": text_of(text_bytes, rng),
        "logprobs": [
            TokenLogprob(token="the", logprob=-0.1, top={"the": -0.1, "a": -2.5}),
            TokenLogprob(token=" fox", logprob=-0.3, top={" fox": -0.3}),
        ],
        "inflight_incumbent": 3,
        "inflight_candidate": 1,
        "guard": {"sample_rate": 1.0, "backing_off": False},
    }
    fields.update(overrides)
    return ExchangeRecord.model_validate(fields)


def exchanges(
    n: int,
    *,
    start: datetime = T0,
    step: timedelta = timedelta(milliseconds=10),
    deployment: str = "dep-a",
    text_bytes: int = 200,
    seed: int = 0,
) -> list[ExchangeRecord]:
    """``n`` exchanges: pairs of incumbent+candidate, one pair every ``step``."""
    out = []
    for i in range(n):
        pair = uuid.UUID(int=(seed << 64) + i // 2 + 1)
        out.append(
            exchange(
                pair_id=pair,
                role="incumbent" if i % 2 == 0 else "candidate",
                sent_at=start + step * (i // 2),
                deployment=deployment,
                text_bytes=text_bytes,
                seed=seed * 1_000_003 + i,
            )
        )
    return out


def health(
    *,
    engine: str = "vllm@incumbent",
    ts: datetime = T0,
    deployment: str = "dep-a",
    **overrides: Any,
) -> HealthSample:
    """A healthy vLLM scrape with every field filled in; ``overrides`` replace any field."""
    fields: dict[str, Any] = {
        "deployment": deployment,
        "engine": engine,
        "role": "incumbent",
        "flavor": "vllm",
        "ts": ts,
        "up": True,
        "http_status": 200,
        "latency_s": 0.002,
        "version": "0.6.3",
        "process_start_time": 1_790_000_000.0,
        "num_running": 4,
        "num_waiting": 0,
        "kv_cache_usage": 0.25,
        "gpu_mem_bytes": 70_000_000_000,
        "cpu_mem_bytes": 8_000_000_000,
        "metrics": {"vllm:num_preemptions_total": 0.0},
    }
    fields.update(overrides)
    return HealthSample.model_validate(fields)


def health_series(
    n: int, *, start: datetime = T0, step: timedelta = timedelta(seconds=5), **kw: Any
) -> list[HealthSample]:
    """``n`` scrapes of one engine, one every ``step``."""
    return [health(ts=start + step * i, **kw) for i in range(n)]
