"""trtllm-serve's recorded answers (``tests/fixtures/trtllm-1.2.0rc2/``), and the simulator's
TensorRT-LLM flavor held to them.

The fixtures come from TensorRT-LLM's own server code run on CPU with a stub generator
(``shadow-ab engine trtllm record --source DIR``; see the folder's README). The first tests read
only the files (no server): every battery entry is there and holds what the recorder promises.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shadow_ab.dev.engines import fixtures, trtllm_serve

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
