"""Simulator test fixtures: simulators with tiny latencies where timing is not the point."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sim_helpers import FAST, TRT_PERMISSIVE

from shadow_ab.dev.processes import RunningSim, running_sim


@pytest.fixture(scope="module", params=["vllm", "trtllm"])
def sim(request: pytest.FixtureRequest) -> Iterator[RunningSim]:
    """A clean simulator of each flavor, shared by a module's tests. TensorRT-LLM's runs the
    TensorRT backend and accepts completions' logprobs, so the shared tests can ask ``n > 1``
    and ``logprobs`` of both (its defaults refuse them, as 1.2.0rc2 does:
    ``test_sim_trtllm_fixtures.py``)."""
    overrides = FAST if request.param == "vllm" else {**FAST, **TRT_PERMISSIVE}
    with running_sim(request.param, "clean", overrides=overrides) as s:
        yield s


@pytest.fixture(scope="module")
def vllm_sim() -> Iterator[RunningSim]:
    with running_sim("vllm", "clean", overrides=FAST) as s:
        yield s


@pytest.fixture(scope="module")
def trt_sim() -> Iterator[RunningSim]:
    with running_sim("trtllm", "clean", overrides=FAST) as s:
        yield s
