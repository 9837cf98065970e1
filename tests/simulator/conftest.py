"""Simulator test fixtures: simulators with tiny latencies where timing is not the point."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `pytest` (unlike `python -m pytest`) does not put the repository root on sys.path, while
# pytest's rootdir conftest puts tests/ there, so tests/simulator/ would shadow the simulator
# package as a namespace package (importlib.resources then looks for the shipped scenarios in
# the wrong folder). The repository root goes first.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from sim_helpers import FAST  # noqa: E402

from simulator.testing import RunningSim, running_sim  # noqa: E402


@pytest.fixture(scope="module", params=["vllm", "trtllm"])
def sim(request: pytest.FixtureRequest) -> Iterator[RunningSim]:
    """A clean simulator of each flavor, shared by a module's tests."""
    with running_sim(request.param, "clean", overrides=FAST) as s:
        yield s


@pytest.fixture(scope="module")
def vllm_sim() -> Iterator[RunningSim]:
    with running_sim("vllm", "clean", overrides=FAST) as s:
        yield s


@pytest.fixture(scope="module")
def trt_sim() -> Iterator[RunningSim]:
    with running_sim("trtllm", "clean", overrides=FAST) as s:
        yield s
