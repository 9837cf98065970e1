"""Fixtures shared by the mirror tests: one pair of simulator engines for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mirror_helpers import FAST

from shadow_ab.dev.processes import RunningSim, running_pair


@pytest.fixture(scope="session")
def engines() -> Iterator[tuple[RunningSim, RunningSim]]:
    """A vLLM-flavored incumbent and a TensorRT-LLM-flavored candidate, clean and quick."""
    with running_pair(("vllm", "clean"), ("trtllm", "clean"), overrides=FAST, ledger=False) as p:
        yield p
