"""The chaos scenarios live in bench/chaos.py (a script folder, not a package): put it on the
path, and share one pair of simulators between the scenarios of a session."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import chaos


@pytest.fixture(scope="session")
def chaos_engines() -> Iterator[tuple[chaos.RunningSim, chaos.RunningSim]]:
    with chaos.engines() as pair:
        yield pair


@pytest.fixture
def ctx(chaos_engines: tuple[chaos.RunningSim, chaos.RunningSim], tmp_path: Path) -> chaos.Ctx:
    """Quick mode: the scenario's figures are smaller, its targets the same."""
    inc, cand = chaos_engines
    return chaos.Ctx(inc, cand, quick=True, kafka=None, tmp=tmp_path)
