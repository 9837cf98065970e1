"""Redaction of prompts and outputs for tokens without the `content` scope (plain values)."""

from __future__ import annotations

from typing import Any

from api.redact import redact, redact_parameters, split_request


def test_redact_nulls_text_fields_and_token_lists_anywhere() -> None:
    body: dict[str, Any] = {
        "verdict": "GO",
        "examples": {
            "worst": [
                {"pair_id": "p1", "tokens": ["42", "43"], "edit_similarity": 0.5},
                {"pair_id": "p2", "tokens": [3, 4], "candidate_output": "secret"},
            ]
        },
        "prompt": None,
    }
    out, found = redact(body)
    assert found
    worst = out["examples"]["worst"]
    assert worst[0] == {"pair_id": "p1", "tokens": None, "edit_similarity": 0.5}
    assert worst[1] == {"pair_id": "p2", "tokens": [3, 4], "candidate_output": None}
    assert out["verdict"] == "GO"
    assert body["examples"]["worst"][0]["tokens"] == ["42", "43"]  # input untouched


def test_token_lists_alone_do_not_count_as_page_text() -> None:
    out, found = redact({"examples": [{"tokens": ["a", "b"]}], "output_text": ""})
    assert out == {"examples": [{"tokens": None}], "output_text": None}
    assert not found


def test_split_request() -> None:
    prompt, params = split_request({"messages": [{"role": "user"}], "temperature": 0})
    assert prompt == [{"role": "user"}]
    assert params == {"temperature": 0}
    prompt, params = split_request({"prompt": "hi", "suffix": "!", "max_tokens": 5})
    assert prompt == {"prompt": "hi", "suffix": "!"}
    assert params == {"max_tokens": 5}
    assert split_request({"seed": 1}) == (None, {"seed": 1})


def test_read_scope_parameters_redact_keys_too() -> None:
    params = {"model": "m", "metadata": {"alice@example.com": "vip", "tier": "5551234567"}}
    assert redact_parameters(params, content=False) == {
        "model": "m",
        "metadata": {"[EMAIL]": "vip", "tier": "[PHONE]"},
    }
    assert redact_parameters(params, content=True) == params
