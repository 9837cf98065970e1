"""Shared values for the simulator tests (a module with a unique name, importable by tests)."""

from __future__ import annotations

from typing import Any

FAST: dict[str, Any] = {
    "latency": {
        "decode_ms": 0.3,
        "prefill_base_ms": 0.5,
        "prefill_per_token_ms": 0.0,
        "noise": 0.0,
    },
    "answers": {"min_tokens": 24, "max_tokens": 60},
}
"""Scenario overrides for tiny latencies, where timing is not the point."""

TRT_PERMISSIVE: dict[str, Any] = {"backend": "tensorrt", "completion_logprobs": True}
"""TensorRT-LLM flavor overrides that accept ``n > 1`` and completions' ``logprobs``."""
