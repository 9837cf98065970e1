"""A client's generate body sized up before it is parsed (mirror/body.py, issue 26): hostile
bodies are refused with their reason without building their objects, real ones are parsed as
orjson parses them. Plain function calls, no services."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import orjson
import pytest
from factories import exchange

from mirror import body as mb
from mirror.body import (
    MALFORMED,
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_STRINGS,
    MAX_VALUES,
    REASONS,
    TOO_DEEP,
    TOO_MANY_CONTAINERS,
    TOO_MANY_STRINGS,
    TOO_MANY_VALUES,
    inspect_body,
)
from mirror.privacy import (
    OVER_BUDGET,
    REDACTION_BUDGET,
    REDACTION_STRING_COST,
    REWRITE_OVER_BUDGET,
    Privacy,
    PrivacyConfig,
)
from mirror.rewrite import CandidateRewrite, candidate_request
from shadow_ab.privacy import redact_text

HEAD = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":'

# -- real bodies -----------------------------------------------------------------------------------

WORDS = "the model should answer in a short paragraph about the order invoice summary".split()


def prose(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n // 6))


def long_chat() -> dict[str, Any]:
    """~1 MiB: a system prompt, 60 turns with text and image parts, tool calls whose
    arguments are JSON in a string (escaped quotes), newlines, a Windows path, 64 tools."""
    rng = random.Random(3)
    messages: list[dict[str, Any]] = [{"role": "system", "content": prose(rng, 4000)}]
    for i in range(60):
        text = prose(rng, 1500) + '\nsee "C:\\temp\\" and {braces} [brackets], "quoted"'
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "QUJD" * 3000},
                    },
                ],
            }
        )
        args = orjson.dumps({"query": prose(rng, 80), "filters": {"ids": [1, 2, 3]}}).decode()
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "search", "arguments": args},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": prose(rng, 900)})
    schema = {
        "type": "object",
        "properties": {
            f"p{j}": {"type": "string", "description": prose(rng, 60), "enum": ["a", "b"]}
            for j in range(8)
        },
        "required": ["p0"],
    }
    tools = [
        {
            "type": "function",
            "function": {"name": f"t{i}", "description": prose(rng, 200), "parameters": schema},
        }
        for i in range(64)
    ]
    return {"model": "m", "messages": messages, "tools": tools, "stream": True, "max_tokens": 512}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(long_chat(), id="long-chat-with-tools-and-images"),
        pytest.param(
            {"model": "m", "prompt": prose(random.Random(1), 1_000_000), "max_tokens": 16},
            id="completions-1MB-prompt",
        ),
        pytest.param({"model": "m", "prompt": list(range(200_000))}, id="completions-token-ids"),
        pytest.param(
            {"model": "m", "prompt": ["[[[[{{{{", '\\"]]]', "\\", '"', '\\\\"[', "}}"] * 1000},
            id="brackets-quotes-backslashes-inside-strings",
        ),
    ],
)
def test_real_bodies_are_parsed_as_orjson_parses_them(value: dict[str, Any]) -> None:
    raw = orjson.dumps(value)
    got = inspect_body(raw)
    assert got.reason is None
    assert got.body == orjson.loads(raw) == value


def test_the_long_chat_is_a_realistic_size() -> None:
    raw = orjson.dumps(long_chat())
    assert 900_000 < len(raw) < 1_200_000


# -- hostile bodies (the review's findings) --------------------------------------------------------


def peak_of(raw: bytes) -> tuple[str | None, int]:
    tracemalloc.start()
    try:
        got = inspect_body(raw)
        return got.reason, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_million_empty_objects_are_refused_without_building_them() -> None:
    # finding 1: 8 MiB of `{},` took the mirror from 192 to 743 MiB and stalled it 23.7 s
    raw = HEAD + b"[" + b",".join([b"{}"] * 1_000_000) + b"]}"
    reason, peak = peak_of(raw)
    assert reason == TOO_MANY_CONTAINERS
    # orjson.loads alone would allocate ~70 bytes a dict (~25x the body): the scan copies
    # the body's structural bytes at most twice
    assert peak < 3 * len(raw)


def test_half_a_million_e_mail_strings_are_refused_without_building_them() -> None:
    # finding 2: ~520k distinct e-mail addresses stalled the loop 14.4 s in the redactor
    raw = HEAD + b"[" + b",".join(b'"u%06d@e.io"' % i for i in range(520_000)) + b"]}"
    assert len(raw) < 8 * 1024 * 1024
    reason, peak = peak_of(raw)
    assert reason == TOO_MANY_STRINGS
    assert peak < 3 * len(raw)


@pytest.mark.parametrize("depth", [MAX_DEPTH, 255, 990, 5000])
def test_deep_nesting_is_refused(depth: int) -> None:
    # finding 3: 990 deep made strip_credentials raise (a 500); past 254 orjson cannot write
    # the body back for the candidate or the record
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)  # the top-level object is one level
    reason, peak = peak_of(b'{"model":"m","x":' + inner + b"}")
    assert reason == (None if depth <= MAX_DEPTH else TOO_DEEP)
    assert peak < 64 * 1024 + 8 * depth


def test_depth_is_counted_outside_strings_only() -> None:
    deep = b"[" * 300 + b"]" * 300
    # brackets inside a string, after escaped quotes and escaped backslashes, do not nest
    hidden = b'{"a":"\\"' + deep + b'\\\\","b":"\\\\\\"' + deep + b'"}'
    assert inspect_body(hidden).body == orjson.loads(hidden)
    # an escaped backslash before the closing quote does not hide what follows
    shown = b'{"a":"x\\\\","b":' + deep + b"}"
    assert inspect_body(shown).reason == TOO_DEEP


def test_many_scalars_are_refused_past_the_limit() -> None:
    raw = b'{"prompt":[' + b",".join([b"1"] * MAX_VALUES) + b"]}"
    assert inspect_body(raw).reason == TOO_MANY_VALUES
    fits = b'{"prompt":[' + b",".join([b"1"] * (MAX_VALUES - 3)) + b"]}"
    assert inspect_body(fits).reason is None


def test_the_limits_are_exact() -> None:
    def strings(n: int) -> bytes:  # the key "s" is a string too
        return b'{"s":[' + b",".join([b'""'] * (n - 1)) + b"]}"

    assert inspect_body(strings(MAX_STRINGS)).reason is None
    assert inspect_body(strings(MAX_STRINGS + 1)).reason == TOO_MANY_STRINGS

    def containers(n: int) -> bytes:  # the top-level object and the array count
        return b'{"c":[' + b",".join([b"{}"] * (n - 2)) + b"]}"

    assert inspect_body(containers(MAX_CONTAINERS)).reason is None
    assert inspect_body(containers(MAX_CONTAINERS + 1)).reason == TOO_MANY_CONTAINERS


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1,2]",
        b'"a string"',
        b"42",
        b'{"a":"unterminated}',
        b'{"a":1',
        b'{"a":"\xff"}',
        b"{}}",
    ],
)
def test_malformed(raw: bytes) -> None:
    got = inspect_body(raw)
    assert got.body is None and got.reason == MALFORMED


def test_reasons_are_label_values() -> None:
    assert len(set(REASONS)) == len(REASONS) == 5
    assert all(r.replace("_", "").isalpha() and r.islower() for r in REASONS)


# -- the scan against a plain walk of random documents ---------------------------------------------

PIECES = ['"', "\\", "[", "]", "{", "}", ",", ":", "a", "é", "\n", '\\"', "\\\\"]


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth > 9 or kind < 0.35:
        return rng.choice([1, -2.5, True, None, "".join(rng.choices(PIECES, k=rng.randint(0, 6)))])
    if kind < 0.7:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {
        "".join(rng.choices(PIECES, k=3)): random_value(rng, depth + 1)
        for _ in range(rng.randint(0, 4))
    }


def reference(value: Any) -> str | None:
    """The reason by a walk of the parsed value, in the scan's order of checks."""
    strings = containers = commas = depth = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            strings += 1
        elif isinstance(v, dict | list):
            containers += 1
            depth = max(depth, d)
            commas += max(len(v) - 1, 0)
            strings += len(v) if isinstance(v, dict) else 0
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    if strings > mb.MAX_STRINGS:
        return TOO_MANY_STRINGS
    if containers > mb.MAX_CONTAINERS:
        return TOO_MANY_CONTAINERS
    if commas + containers + 1 > mb.MAX_VALUES:
        return TOO_MANY_VALUES
    if depth > mb.MAX_DEPTH:
        return TOO_DEEP
    return None


@pytest.mark.parametrize("seed", range(8))
def test_the_scan_counts_what_a_walk_counts(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    limits = {"MAX_STRINGS": 40, "MAX_CONTAINERS": 30, "MAX_VALUES": 60, "MAX_DEPTH": 5}
    for name, limit in limits.items():
        monkeypatch.setattr(mb, name, limit)
    seen = set()
    for _ in range(400):
        value = {"v": random_value(rng, 2)}
        raw = orjson.dumps(value)
        expected = reference(value)
        got = inspect_body(raw)
        assert got.reason == expected, raw
        assert got.body == (value if expected is None else None)
        seen.add(expected)
    assert len(seen) >= 3  # the documents reach several limits, not only one


# -- what walks the body on the mirror's path: any depth, bounded redaction ------------------------


def deep(depth: int, bottom: dict[str, Any]) -> dict[str, Any]:
    value: Any = bottom
    for _ in range(depth // 2):
        value = {"x": [value]}
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": value}


def bottom_of(value: Any, depth: int) -> Any:
    value = value["metadata"]
    for _ in range(depth // 2):
        value = value["x"][0]
    return value


def test_the_candidates_request_at_depth_5000() -> None:
    body = deep(5000, {"password": "pw", "keep": 1})
    out, rewrites = candidate_request(body, chat=True, rewrite=CandidateRewrite())
    assert bottom_of(out, 5000) == {"keep": 1}
    assert rewrites[0] == "credential:metadata." + ".".join(["x[0]"] * 2500) + ".password"


def test_a_record_at_depth_5000_is_redacted_not_dropped() -> None:
    record = exchange(request=deep(5000, {"api_key": "sk-1", "mail": "to a@b.example"}))
    out = Privacy(PrivacyConfig()).apply(record, "full")  # raised RedactionError (recursion)
    assert bottom_of(out.request, 5000) == {"mail": "to [EMAIL]"}


def e_mails(n: int) -> dict[str, Any]:
    return {"model": "m", "metadata": [f"u{i:06d}@e.io" for i in range(n)]}


def test_the_redactor_works_within_a_budget_and_keeps_nothing_past_it() -> None:
    # finding 2 at the function level: 520k distinct e-mail addresses, each a call of the
    # redactor (1.3 s of CPU a record, three records a pair)
    calls: list[int] = []

    def counting(text: str) -> str:
        calls.append(len(text))
        return redact_text(text)

    privacy = Privacy(PrivacyConfig())
    privacy.redactor = counting
    record = exchange(request=e_mails(520_000), output_text="mail me at x@y.example")
    out = privacy.apply(record, "full")
    assert sum(n + REDACTION_STRING_COST for n in calls) <= REDACTION_BUDGET + 2_000
    kept = out.request["metadata"]
    assert len(kept) == 520_000
    assert not any("@" in s for s in kept)  # never kept unredacted
    assert kept[0] == "[EMAIL]" and kept[-1] == OVER_BUDGET
    assert out.output_text == "mail me at [EMAIL]"  # the answer is always redacted
    assert out.rewrites[-1] == REWRITE_OVER_BUDGET


def test_a_record_within_the_budget_is_redacted_whole() -> None:
    out = Privacy(PrivacyConfig()).apply(exchange(request=e_mails(1000)), "full")
    assert set(out.request["metadata"]) == {"[EMAIL]"}
    assert REWRITE_OVER_BUDGET not in out.rewrites
