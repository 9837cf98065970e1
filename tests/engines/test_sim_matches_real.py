"""The simulator's vLLM flavor against a running real vLLM (the session's bf16 engine), live:
every request of the fixtures' matrix (:data:`fixtures.MATRIX`) goes to both, and the answers
must have the same structure (:func:`fixtures.differences`: status, the headers that matter,
SSE framing, chunk kinds in order, and per kind the same keys in the same order with the same
JSON types), then their ``/metrics`` the same families, types and labels (``http_*`` aside,
which the simulator does not model). The recorded fixtures (``tests/fixtures/vllm-0.32.0/``)
make the same comparison without a real engine; this one notices when the engine moves."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from shadow_ab.dev.engines import fixtures
from shadow_ab.dev.engines.vllm_cpu import SERVED_MODEL, RunningVllm
from shadow_ab.dev.processes import RunningSim, http_get, running_sim

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1200)]

QUICK = {"decode_ms": 0.3, "prefill_base_ms": 0.5, "prefill_per_token_ms": 0.0, "noise": 0.0}


@pytest.fixture(scope="module")
def sim(vllm_bf16: RunningVllm) -> Iterator[RunningSim]:
    """The simulator set up like the real engine: its model name and context length."""
    status, body = http_get(vllm_bf16.v1 + "/models", timeout=10.0)
    assert status == 200
    card = json.loads(body)["data"][0]
    overrides = {
        "model": SERVED_MODEL,
        "latency": {**QUICK, "max_model_len": card["max_model_len"]},
        "answers": {"min_tokens": 24, "max_tokens": 60},
    }
    with running_sim("vllm", "clean", overrides=overrides, ledger=False) as s:
        yield s


@pytest.mark.parametrize("case", fixtures.MATRIX, ids=[c.name for c in fixtures.MATRIX])
def test_the_simulator_answers_like_real_vllm(
    vllm_bf16: RunningVllm, sim: RunningSim, case: fixtures.Case
) -> None:
    real = fixtures.to_fixture(case, fixtures.ask(vllm_bf16.base_url, case))
    simulated = fixtures.to_fixture(case, fixtures.ask(sim.base_url, case))
    assert fixtures.differences(real, simulated) == []


def test_the_simulators_metrics_are_real_vllms(vllm_bf16: RunningVllm, sim: RunningSim) -> None:
    """After the matrix (so histograms have observations): the same families with the same
    types, sample names and label names in the same order."""
    for case in fixtures.MATRIX:  # whatever ran before, both have seen the matrix
        fixtures.ask(sim.base_url, case)
        fixtures.ask(vllm_bf16.base_url, case)
    real = fixtures.metric_families(http_get(vllm_bf16.base_url + "/metrics", 10.0)[1].decode())
    simulated = fixtures.metric_families(http_get(sim.base_url + "/metrics", 10.0)[1].decode())
    wanted = {n: f for n, f in real.items() if not n.startswith("http_")}
    assert sorted(set(wanted) - set(simulated)) == []
    assert sorted(n for n in set(simulated) - set(real) if not n.startswith("sim:")) == []
    for name, family in wanted.items():
        assert (simulated[name].type, simulated[name].samples) == (family.type, family.samples)
