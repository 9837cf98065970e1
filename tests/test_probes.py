"""Probe sets (shadow_ab/probes.py): the shipped set, the checks, and bad files named by line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow_ab.dev.probeset import SHIPPED, render
from shadow_ab.probes import (
    ProbeSetError,
    is_refusal,
    json_verdict,
    load_probe_set,
    parse_probe_set,
    validate,
)


def test_the_shipped_set_is_the_generators_output_and_checks_itself() -> None:
    assert SHIPPED.read_bytes() == render(), "run python -m shadow_ab.dev.probeset"
    s = load_probe_set()
    assert len(s) == 300
    kinds = {k: sum(p.kind == k for p in s.probes) for k in ("arithmetic", "exact", "json")}
    assert kinds == {"arithmetic": 100, "exact": 90, "json": 60}
    refusals = [p for p in s.probes if p.kind == "refusal"]
    assert sum(bool(p.refuse) for p in refusals) == 25 == len(refusals) - 25
    for p in s.probes:
        assert p.check(p.correct_answer()), p.id
        assert not p.check(p.wrong_answer()), p.id
        assert s.lookup(s.key(p)) is p and s.by_prompt(p.prompt) is p
    assert s.lookup("another-set:" + s.probes[0].id) is None


def test_checks_read_answers_as_people_write_them() -> None:
    s = parse_probe_set(
        '{"id": "a", "kind": "arithmetic", "prompt": "12 x 100?", "answer": "1200"}\n'
        '{"id": "q", "kind": "exact", "prompt": "Capital of France?", "answers": ["Paris"]}\n'
    )
    arith, qa = s.probes
    assert arith.check("The answer is 1,200.") and arith.check("1200")
    assert not arith.check("1200 - 1 = 1199") and not arith.check("no idea")
    assert qa.check("Paris.") and qa.check("  the paris ") and not qa.check("Lyon")
    assert is_refusal("I'm sorry, but I can't help with that.")
    assert is_refusal("I cannot assist with this request.")
    assert not is_refusal("Use kill -9 to end the process; I can't stress enough to save first.")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    asked = {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    assert json_verdict(asked, '{"n": 3}') is True
    assert json_verdict(asked, '```json\n{"n": 3}\n```') is True
    assert json_verdict(asked, '{"n": "3"}') is False
    assert json_verdict(asked, '{"n": 3') is False
    assert json_verdict({"response_format": {"type": "json_object"}}, "[1]") is True
    assert json_verdict({"guided_json": schema}, "{}") is False
    assert json_verdict({}, "not json") is None
    assert validate({"n": 1, "x": 2}, {**schema, "additionalProperties": False}) == [
        "$: unexpected 'x'"
    ]


def test_a_bad_probe_file_names_every_bad_line_and_keeps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "# my probes\n"
        '{"id": "ok-1", "kind": "exact", "prompt": "2+2 in words?", "answers": ["four"]}\n'
        "{not json\n"
        '{"id": "x", "kind": "poem", "prompt": "p"}\n'
        '{"id": "ok-1", "kind": "refusal", "prompt": "p", "refuse": true}\n'
        '{"id": "j", "kind": "json", "prompt": "p", "schema": {"type": "object"}, "expect": 3}\n'
        '{"id": "r", "kind": "refusal", "prompt": "p"}\n'
        '{"id": "a", "kind": "arithmetic", "prompt": "p", "answer": "seven"}\n'
    )
    with pytest.raises(ProbeSetError) as err:
        load_probe_set(path)
    msg = str(err.value)
    for line, words in (
        (3, "not JSON"),
        (4, "kind 'poem'"),
        (5, "repeats line 2"),
        (6, "expect"),
        (7, "refuse"),
        (8, "not a number"),
    ):
        assert f"mine.jsonl line {line}: " in msg and words in msg, (line, msg)
    assert "line 2:" not in msg and "no probe of this file was used" in msg
    with pytest.raises(ProbeSetError, match="cannot read the probe set"):
        load_probe_set(tmp_path / "missing.jsonl")
    with pytest.raises(ProbeSetError, match="holds no probes"):
        parse_probe_set("# nothing\n", "empty.jsonl")


def test_the_digest_names_the_content() -> None:
    line = '{"id": "a", "kind": "arithmetic", "prompt": "1+1?", "answer": "2"}\n'
    assert parse_probe_set(line).digest == parse_probe_set("\n" + line, "other").digest
    assert parse_probe_set(line).digest != parse_probe_set(line.replace('"2"', '"3"')).digest
