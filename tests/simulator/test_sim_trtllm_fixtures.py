"""trtllm-serve's recorded answers (``tests/fixtures/trtllm-1.2.0rc2/``), and the simulator's
TensorRT-LLM flavor held to them.

The fixtures come from TensorRT-LLM's own server code run on CPU with a stub generator
(``shadow-ab engine trtllm record --source DIR``; see the folder's README). The first tests read
only the files (no server): every battery entry is there and holds what the recorder promises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import FAST

from shadow_ab.dev.engines import fixtures, trtllm_serve
from shadow_ab.dev.processes import RunningSim, http_get, running_sim
from simulator.scenario import DEFAULT_VERSION

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "trtllm-1.2.0rc2"
RECORDED = fixtures.load(FOLDER)
META = json.loads((FOLDER / "meta.json").read_text())


def chunks(name: str) -> list[dict[str, Any]]:
    return [json.loads(f.removeprefix("data: ")) for f in RECORDED[name]["sse"]
            if f.startswith("data: {")]  # fmt: skip


def test_every_battery_entry_was_recorded() -> None:
    assert set(RECORDED) == {c.name for c in trtllm_serve.BATTERY}
    for case in trtllm_serve.BATTERY:
        fixture = RECORDED[case.name]
        assert fixture["request"] == {"method": case.method, "path": case.path,
                                      "body": case.body}, case.name  # fmt: skip
        assert isinstance(fixture["status"], int)
        assert len([k for k in ("json", "sse", "text") if k in fixture]) == 1, case.name
    assert META["version"] == "1.2.0rc2"
    assert set(META["source_files"]) == {f"tensorrt_llm/{p}" for p in trtllm_serve.SOURCE_FILES}
    assert META["pins"] == list(trtllm_serve.PINS)


def test_volatile_fields_are_normalised() -> None:
    for name, fixture in RECORDED.items():
        assert dict(fixture["headers"]).get("date") in (None, "<date>"), name
        bodies = chunks(name) if "sse" in fixture else [fixture.get("json")]
        for body in bodies:
            if isinstance(body, dict) and "created" in body:
                assert body["created"] == 0, name
                assert body["id"].endswith(">"), name
    for line in RECORDED["prometheus-metrics"]["text"].splitlines():
        assert line.startswith("#") or not line or line.endswith(" <v>")


def test_streams_as_recorded_facts_say() -> None:
    """The facts the simulator's README states about trtllm-serve's streams."""
    for name in ("chat-stream", "chat-stream-usage", "chat-stream-logprobs"):
        frames = RECORDED[name]["sse"]
        assert frames[0].endswith("} ") and frames[-1] == "data: [DONE]", name  # the role chunk
        assert not any(f.endswith(" ") for f in frames[1:]), name
        for c in chunks(name)[1:]:
            for choice in c["choices"]:
                assert choice["delta"]["reasoning_content"] == "", name
        ids = [c["id"] for c in chunks(name)]
        assert len(set(ids)) == len(ids), name  # every chunk its own id
    # include_usage alone: continuous usage on every chunk, then a usage chunk
    for name in ("chat-stream-usage", "cmpl-stream-usage"):
        assert all(c.get("usage") for c in chunks(name)), name
    for name in ("chat-stream-usage-no-continuous", "cmpl-stream-usage-no-continuous"):
        assert [bool(c.get("usage")) for c in chunks(name)][-2:] == [False, True], name
    last = chunks("cmpl-stream-usage")[-1]
    assert last["object"] == "chat.completion.chunk" and last["id"].startswith("chatcmpl-")
    assert last["choices"] == []
    assert all(c["usage"] is None for c in chunks("cmpl-stream"))


def test_errors_as_recorded_facts_say() -> None:
    for name, fixture in RECORDED.items():
        if "-400-" in name:
            body = fixture["json"]
            assert fixture["status"] == 400, name
            assert list(body) == ["object", "message", "type", "param", "code"], name
            assert (body["object"], body["type"], body["param"], body["code"]) == (
                "error", "BadRequestError", None, 400), name  # fmt: skip
    assert (
        "Value error, logprobs is not supported" in RECORDED["cmpl-400-logprobs"]["json"]["message"]
    )
    for name in ("chat-400-n2", "cmpl-400-n2"):
        assert RECORDED[name]["json"]["message"] == (
            "Multiple response is not supported in PyTorch workflow"
        )
    assert "extra_forbidden" in RECORDED["chat-400-unknown-field"]["json"]["message"]
    for name in ("chat-unknown-model", "cmpl-unknown-model"):
        assert RECORDED[name]["status"] == 200
        assert RECORDED[name]["json"]["model"] == "no-such-model"
    assert RECORDED["health"]["status"] == 200 and RECORDED["health"]["text"] == ""
    assert RECORDED["version"]["json"] == {"version": "1.2.0rc2"}


@pytest.mark.parametrize("name", ["chat", "cmpl"])
def test_the_comparison_sees_a_changed_key(name: str) -> None:
    recorded = RECORDED[name]
    changed = {**recorded, "json": {**recorded["json"], "extra": 1}}
    assert fixtures.differences(recorded, changed) != []


# -- the simulator's TensorRT-LLM flavor, held to the recording --------------------------------

VOLATILE = {"content", "text", "token", "bytes", "logprob", "prompt_tokens", "total_tokens",
            "completion_tokens"}  # fmt: skip
"""Values the simulator cannot share with the stub (its own texts, tokens, logprob values and
token counts); every other JSON value is compared."""

NOT_SIMULATED = {"metrics", "prometheus-metrics"}
"""``/metrics`` is the stub's iteration stats (only its list envelope is the server's; held by
``test_sim_vllm_source.py`` and the mirror's health tests); ``/prometheus/metrics`` is not
mounted without ``return_perf_metrics`` (its families: ``test_sim_vllm_source.py``)."""


def _framing(fixture: dict[str, Any]) -> dict[str, list[str]]:
    """Per chunk kind, the distinct tails after each event's JSON (``" "`` on the role chunk)."""
    out: dict[str, list[str]] = {}
    for frame in fixture.get("sse", []):
        if frame.startswith("data: {"):
            payload = frame.removeprefix("data: ")
            kind = fixtures.chunk_kind(json.loads(payload))
            tails = out.setdefault(kind, [])
            tail = payload[len(payload.rstrip()) :]
            if tail not in tails:
                tails.append(tail)
    return out


def _unframed(fixture: dict[str, Any]) -> dict[str, Any]:
    if "sse" not in fixture:
        return fixture
    return {**fixture, "sse": [f.rstrip(" ") for f in fixture["sse"]]}


def _values(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: "<v>" if k in VOLATILE else _values(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return fixtures._distinct(_values(v) for v in obj)
    return obj


def _id_prefix(obj: dict[str, Any]) -> str:
    return str(obj.get("id", "")).split("-", 1)[0]


def trt_stream_shape(fixture: dict[str, Any]) -> dict[str, Any]:
    """A trtllm-serve stream reduced to what does not depend on timing: the framing per kind of
    chunk (:func:`fixtures.stream_shape` refuses its mixed framing), whether every chunk has
    its own id, and per kind the distinct chunks with volatile values blanked."""
    objs = [json.loads(f.removeprefix("data: ")) for f in fixture["sse"]
            if f.startswith("data: {")]  # fmt: skip
    values: dict[str, list[Any]] = {}
    for obj in objs:
        kind = fixtures.chunk_kind(obj)
        seen = values.setdefault(kind, [])
        v = {**_values(obj), "id": _id_prefix(obj)}
        if v not in seen:
            seen.append(v)
    ids = [o["id"] for o in objs]
    return {"framing": _framing(fixture), "own_ids": len(set(ids)) == len(ids), "values": values}


def trt_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """:func:`fixtures.differences` (status, headers that matter, keys, order, JSON types,
    non-JSON bodies byte for byte) on the streams without their framing, plus the framing per
    kind of chunk, and the values outside :data:`VOLATILE`."""
    out = fixtures.differences(_unframed(expected), _unframed(actual), text=True)
    if "sse" in expected and "sse" in actual:
        a, b = trt_stream_shape(expected), trt_stream_shape(actual)
        for k in ("framing", "own_ids"):
            if a[k] != b[k]:
                out.append(f"sse {k}: {a[k]!r} != {b[k]!r}")
        for kind in fixtures._distinct([*a["values"], *b["values"]]):
            va, vb = a["values"].get(kind), b["values"].get(kind)
            if va != vb:
                out.append(f"sse {kind} values: {json.dumps(va)} != {json.dumps(vb)}")
    elif "json" in expected and "json" in actual:
        va, vb = _values(expected["json"]), _values(actual["json"])
        if isinstance(va, dict) and "id" in va:
            va["id"], vb["id"] = _id_prefix(va), _id_prefix(vb)
        if va != vb:
            out.append(f"values: {json.dumps(va)} != {json.dumps(vb)}")
    return out


LIKE_THE_RECORDING = {**FAST, "model": META["model"], "completion_logprobs": False}
"""The recorded server's model name; completions' logprobs refused as 1.2.0rc2 does (the
simulator accepts them by default, for the mirror: simulator/README.md)."""


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningSim]:
    with running_sim("trtllm", "clean", overrides=LIKE_THE_RECORDING, ledger=False) as s:
        yield s


def replay(sim: RunningSim, recorded: dict[str, Any]) -> dict[str, Any]:
    request = recorded["request"]
    case = fixtures.Case(recorded["name"], request["method"], request["path"], request["body"])
    return trtllm_serve.to_fixture(case, fixtures.ask(sim.base_url, case))


def test_the_simulator_targets_the_recorded_version(sim: RunningSim) -> None:
    assert DEFAULT_VERSION["trtllm"] == META["version"]
    assert json.loads(http_get(sim.base_url + "/version")[1]) == {"version": META["version"]}


@pytest.mark.parametrize("name", sorted(set(RECORDED) - NOT_SIMULATED))
def test_the_simulator_answers_as_trtllm_serve(sim: RunningSim, name: str) -> None:
    assert trt_differences(RECORDED[name], replay(sim, RECORDED[name])) == []


def test_the_trtllm_comparison_sees_framing_ids_and_values() -> None:
    stream = RECORDED["chat-stream"]
    assert trt_differences(stream, stream) == []
    with pytest.raises(ValueError, match="mixed SSE framing"):
        fixtures.stream_shape(stream["sse"])
    unspaced = {**stream, "sse": [f.rstrip(" ") for f in stream["sse"]]}
    shared_id = {**stream, "sse": [re.sub(r"chatcmpl-<\d+>", "chatcmpl-<1>", f)
                                   for f in stream["sse"]]}  # fmt: skip
    for changed in (unspaced, shared_id):
        assert trt_differences(stream, changed) != []
    error = RECORDED["chat-400-n2"]
    worded = {**error, "json": {**error["json"], "message": "n must be 1"}}
    assert trt_differences(error, worded) != []
    body = RECORDED["chat"]
    other = {**body, "json": {**body["json"], "model": "other"}}
    assert trt_differences(body, other) != []
    texts = {
        **body,
        "json": {**body["json"], "usage": {**body["json"]["usage"], "prompt_tokens": 9}},
    }
    assert trt_differences(body, texts) == []
