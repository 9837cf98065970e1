"""The msgspec decoder agrees with pydantic's on every field: same records, same poison.

Both decoders get the same messages: valid ones (every field set, every optional field left
out), and for every field its bad types and its bounds (just inside and just outside), plus
JSON texts pydantic and msgspec could read differently (times, UUIDs, huge and tiny numbers,
escapes, duplicate keys). ``decode(fast=True)`` must return what ``decode(fast=False)`` (today's
pydantic validation) returns, value for value and type for type; and where the msgspec
decoder answers alone (:func:`decode_fast` not None), pydantic must build the same record.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from factories import numbered_exchange, numbered_health

from ingester.decode import Poison, decode
from ingester.fastdecode import STRUCTS, decode_exchange_row, decode_fast
from shadow_ab.records import ExchangeRecord, HealthSample, TokenLogprob
from storage.write import WIRE, exchange_values


def _full_exchange() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "deployment": "dep",
        "kind": "exchange",
        "pair_id": "6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4a",
        "role": "candidate",
        "engine": "trtllm@candidate",
        "endpoint": "chat",
        "stream": True,
        "model": "m",
        "sent_at": "2026-11-30T03:00:00.123456Z",
        "status": "ok",
        "http_status": 200,
        "error": None,
        "ttft_s": 0.05,
        "e2e_s": 1.25,
        "tpot_s": 0.0125,
        "itl_s": [0.01, 0.02, 0, 1e-9],
        "prompt_tokens": 12,
        "completion_tokens": 100,
        "finish_reason": "stop",
        "request": {
            "model": "m",
            "messages": [{"role": "user", "content": "héllo \U0001f600"}],
            "temperature": 0,
            "top_p": 0.9,
            "seed": 2**70,
            "n": None,
            "nested": {"a": [1, 2.5, True, None, "x"]},
        },
        "rewrites": ["model", "max_tokens"],
        "output_text": "hi",
        "logprobs": [
            {"token": "hi", "logprob": -0.5, "top": {"hi": -0.5, "ho": -1.5}},
            {"token": "!", "logprob": 0},
        ],
        "inflight_incumbent": 3,
        "inflight_candidate": 0,
        "guard": {"state": "open", "rate": 1.0, "decision": "sampled"},
    }


def _full_health() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "deployment": "dep",
        "kind": "health",
        "engine": "vllm@incumbent",
        "role": "incumbent",
        "flavor": "vllm",
        "ts": "2026-11-30T03:00:00+01:00",
        "up": True,
        "http_status": 200,
        "latency_s": 0.004,
        "error": None,
        "version": "0.32.0",
        "process_start_time": 1764460800.5,
        "num_running": 4,
        "num_waiting": 0,
        "kv_cache_usage": 0.25,
        "gpu_mem_bytes": 2**40,
        "cpu_mem_bytes": 0,
        "metrics": {"a": 1, "b": 2.5},
    }


BASES = {"exchange": _full_exchange, "health": _full_health}
REQUIRED = {
    "exchange": ("deployment", "pair_id", "role", "engine", "endpoint", "stream", "sent_at"),
    "health": ("deployment", "engine", "role", "ts", "up"),
}

# Values every field is tried with: wrong types, bounds, coercible look-alikes.
PROBES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    99,
    100,
    599,
    600,
    2,
    2**31 - 1,
    2**31,
    2**63,
    2**64,
    10**30,
    0.0,
    -0.0,
    0.5,
    1.0,
    1.5,
    -0.5,
    5.0,
    1e308,
    "",
    "x",
    "5",
    "1",
    "0.5",
    "true",
    "a" * 200,
    "a" * 201,
    "\U0001f600" * 200,
    "\U0001f600" * 201,
    [],
    [1],
    [0.5, -1],
    ["x"],
    {},
    {"a": 1},
    {"a": "x"},
    {"token": "t", "logprob": 0},
    [{"token": "t", "logprob": 0}],
    [{"token": "t", "logprob": 0, "extra": 1}],
    [{"token": 1, "logprob": 0}],
    [{"token": "t", "logprob": "0"}],
    [{"token": "t", "logprob": 0, "top": {"a": "1"}}],
    "incumbent",
    "replay",
    "chat",
    "completions",
    "timeout",
    "exchange",
    "health",
    "vllm",
    "trtllm",
    "2026-11-30T03:00:00Z",
    "2026-11-30T03:00:00",
    "2026-11-30",
    "1969-12-31T23:59:59Z",
    "9999-01-01T00:00:00Z",
    "9998-12-31T23:59:59.999999Z",
    1764460800,
    1764460800.5,
    "6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4a",
    "6f1c7a3e4d7b4c1e9a3b2f0e8d6c5b4a",
    "6F1C7A3E-4D7B-4C1E-9A3B-2F0E8D6C5B4A",
]

# JSON texts pydantic and msgspec might read differently, spliced into a field.
RAW: dict[str, list[str]] = {
    "sent_at": [
        '"2026-11-30T03:00:00.1234567Z"',
        '"2026-11-30T03:00:00.123456789+02:00"',
        '"2026-11-30T03:00:00.9999995Z"',
        '"2026-11-30t03:00:00z"',
        '"2026-11-30 03:00:00Z"',
        '"2026-11-30T03:00Z"',
        '"2026-11-30T03:00:00+05:30"',
        '"2026-11-30T03:00:00-00:00"',
        '"2026-11-30T03:00:00+0530"',
        '"2026-11-30T03:00:00+23:59"',
        '"2026-11-30T03:00:00+24:00"',
        '"2026-11-30T23:59:60Z"',
        '"2026-02-29T03:00:00Z"',
        '"2024-02-29T03:00:00Z"',
        '"1970-01-01T00:00:00Z"',
        '"1970-01-01T00:30:00+01:00"',
        '"9998-12-31T23:59:59.999999-01:00"',
        '"0001-01-01T00:00:00Z"',
        '"2026-11-30T03:00:00.Z"',
        '"2026-11-30T03:00:00,5Z"',
        '"  2026-11-30T03:00:00Z"',
        '"2026-11-30T03:00:00Z "',
        '"20261130T030000Z"',
        '"2026-W48-1T03:00:00Z"',
        '"2026-11-30T03:00:00.123Z"',
        "1e10",
        '"1764460800"',
    ],
    "pair_id": [
        '"{6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4a}"',
        '"urn:uuid:6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4a"',
        '"6f1c7a3e-4d7b4c1e-9a3b-2f0e8d6c5b4a"',
        '"6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4"',
        '"6f1c7a3e-4d7b-4c1e-9a3b-2f0e8d6c5b4g"',
        '"00000000-0000-0000-0000-000000000000"',
        '"6f1c7a3e-4d7b-0c1e-0a3b-2f0e8d6c5b4a"',
    ],
    "ttft_s": ["1e400", "-1e400", "1e-400", "1E2", "0e0", "-0", "1.0000000000000000001", "01"],
    "itl_s": ["[1e400]", "[1e308, 1e308]", "[1e-400]", "[-0.0]", "[0.1, 1e400]"],
    "prompt_tokens": ["2147483647", "2147483648", "2147483647.0", "2e3", "-0", "1e400"],
    "http_status": ["200.0", "2e2", "199.9999999999999999"],
    "request": [
        '{"a": 1e400}',
        '{"a": -1e400}',
        '{"a": 18446744073709551616}',
        '{"a": -9223372036854775809}',
        '{"a": 1.7976931348623157e308}',
        '{"a": 5e-324}',
        '{"a": 0.1, "a": 2}',
        '{"a": "\\ud800"}',
        '{"a": "\\ud83d\\ude00"}',
        '{"a": "\\u0000"}',
        '{"\\ud800": 1}',
        '{"a": 123456789012345678901234567890.5}',
    ],
    "output_text": ['"\\ud800"', '"\\udfff x"', '"\\u0000"', '"a\\/b"', '"\\ud83d\\ude00"'],
    "logprobs": [
        '[{"token": "t", "logprob": 1e400}]',
        '[{"token": "t", "logprob": -1e400}]',
        '[{"token": "t", "logprob": 0, "top": {"a": 1e400}}]',
        '[{"token": "t", "logprob": 0, "top": {"a": -1e400}}]',
        '[{"token": "t", "token": "u", "logprob": 0}]',
    ],
    "deployment": ['"\\ud800"', '"a\\u0000"', '"' + "\\u00e9" * 200 + '"'],
    "schema_version": ["1.0", "2", "0", "true"],
    "stream": ["1", '"true"', "0"],
}
RAW_HEALTH: dict[str, list[str]] = {
    "ts": RAW["sent_at"],
    "latency_s": ["1e400", "-0", "1e-400"],
    "process_start_time": ["1e400", "-1e400", "-1.5", "1e308"],
    "kv_cache_usage": ["1.0000000000000001", "1.00001", "-0.0", "1e-400"],
    "gpu_mem_bytes": ["9223372036854775807", "9223372036854775808", "18446744073709551616"],
    "metrics": ['{"a": 1e400}', '{"a": -1e400}', '{"a": 18446744073709551616}', '{"a": true}'],
    "up": ["1", '"yes"'],
}

# Whole texts: not objects, not JSON, odd framing.
TEXTS = [
    b"",
    b"null",
    b"[]",
    b"1",
    b'"x"',
    b"{",
    b"{}",
    b'{"kind": "exchange"}',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe",
]


def _dumps(obj: Any) -> bytes:
    """JSON as a producer might write it (the standard library's: big integers too)."""
    return json.dumps(obj, ensure_ascii=False).encode()


def _splice(doc: dict[str, Any], field: str, raw: str) -> bytes:
    """``doc`` as JSON with ``field``'s value replaced by the JSON text ``raw``."""
    marker = "__SPLICE__"
    return _dumps({**doc, field: marker}).replace(f'"{marker}"'.encode(), raw.encode())


def _messages(kind: str, base: dict[str, Any] | None = None) -> list[bytes]:
    base = base or BASES[kind]()
    out = [_dumps(base)]
    # every optional field left out; then each required one missing
    out.append(_dumps({k: base[k] for k in ("kind", *REQUIRED[kind])}))
    out.append(_dumps({k: base[k] for k in REQUIRED[kind]}))
    for name in base:
        out.append(_dumps({k: v for k, v in base.items() if k != name}))
        for probe in PROBES:
            out.append(_dumps({**base, name: probe}))
    out.append(_dumps({**base, "unknown": 1}))
    out.append(_dumps({**base, "kind": "health" if kind == "exchange" else "exchange"}))
    out.append(b" \n" + _dumps(base) + b" \n")
    out.append(_dumps(base) + b" x")
    out.append(_dumps(base) + b"{}")
    raw = RAW if kind == "exchange" else RAW_HEALTH
    for name, texts in raw.items():
        out.extend(_splice(base, name, t) for t in texts)
    out.extend(TEXTS)
    return out


def _same(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` equal in value and type, recursively (5 == 5.0 does not pass)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, float):
        assert repr(a) == repr(b) or (math.isnan(a) and math.isnan(b)), f"{where}: {a} vs {b}"
    elif isinstance(a, datetime):
        assert (a.isoformat(), a.utcoffset()) == (b.isoformat(), b.utcoffset()), where
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, ExchangeRecord | HealthSample | TokenLogprob):
        _same(a.__dict__, b.__dict__, where)
    elif isinstance(a, Poison):
        assert (a.code, a.detail) == (b.code, b.detail), where
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


@pytest.mark.parametrize("kind", ["exchange", "health"])
def test_both_decoders_agree_on_every_field(kind: str) -> None:
    messages = _messages(kind)
    fast_answers = 0
    valid = 0
    for value in messages:
        for topic_kind in (kind, "health" if kind == "exchange" else "exchange"):
            expected = decode(value, topic_kind, fast=False)
            _same(decode(value, topic_kind, fast=True), expected, repr(value[:300]))
            alone = decode_fast(value, topic_kind)
            if alone is not None:
                fast_answers += 1
                _same(alone, expected, repr(value[:300]))
            valid += not isinstance(expected, Poison)
    # Not vacuous: pydantic refuses most probes, and the fast decoder answers for most of the
    # messages it accepts (not for those pydantic coerces, such as "5" for a count).
    assert len(messages) > 2 * valid
    assert fast_answers > valid * 2 // 3


def test_fast_decoder_takes_the_mirror_s_records() -> None:
    rec = numbered_exchange("dep", 7)
    assert decode_fast(rec.to_json(), "exchange") == rec
    h = numbered_health("dep", 7)
    assert decode_fast(h.to_json(), "health") == h
    assert decode_fast(_dumps(_full_exchange()), "exchange") is not None
    assert decode_fast(_dumps(_full_health()), "health") is not None


def test_fast_decoder_times_are_utc() -> None:
    doc = _full_health()
    out = decode_fast(orjson.dumps(doc), "health")
    assert isinstance(out, HealthSample)
    assert out.ts == datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
    assert out.ts.tzinfo is UTC


@pytest.mark.parametrize("model", [ExchangeRecord, HealthSample, TokenLogprob])
def test_structs_have_the_records_fields(model: type[Any]) -> None:
    """A field added to shadow_ab.records must be added to ingester.fastdecode too."""
    struct = STRUCTS[model]
    assert struct.__struct_fields__ == tuple(model.model_fields)
    assert uuid.UUID  # the structs decode UUIDs as uuid.UUID, as the records hold them


def _wire_row(record: ExchangeRecord) -> tuple[Any, ...]:
    return exchange_values(record, WIRE)


def test_rows_decoder_makes_exactly_the_store_s_rows() -> None:
    """decode_exchange_row yields, cell for cell, what the store makes of pydantic's record
    (type for type: bytes stay bytes, a bytearray a bytearray), on every message of the field
    test; where it is unsure, decode(rows=True) answers exactly as decode() does."""
    # seed 2**70 (the field test's) is beyond the jsonb encoder: a 64-bit one here instead
    base = _full_exchange()
    base["request"] = {**base["request"], "seed": 2**63 - 1}
    messages = (
        _messages("exchange")
        + _messages("exchange", base)
        + [
            numbered_exchange("dep", 7).to_json(),
            _splice(_full_exchange(), "output_text", '"a\\\\u0000 is text, not a NUL"'),
        ]
    )
    rows = 0
    for value in messages:
        expected = decode(value, "exchange", fast=False)
        row = decode_exchange_row(value)
        where = repr(value[:300])
        if row is None:
            _same(decode(value, "exchange", rows=True), expected, where)
            continue
        rows += 1
        assert isinstance(expected, ExchangeRecord), where
        _same(row.row, _wire_row(expected), where)
        assert row.key == (expected.pair_id.int, expected.role, expected.sent_at), where
        assert (row.deployment, row.sent_at) == (expected.deployment, expected.sent_at), where
        _same(row.record(), expected, where)
        assert decode(value, "exchange", rows=True) is not None
        # the other topic's kind never takes the rows path
        _same(decode(value, "health", rows=True), decode(value, "health", fast=False), where)
    # not vacuous: most valid messages of the 64-bit seed's set take the rows path
    small = _messages("exchange", base)
    valid = sum(not isinstance(decode(v, "exchange", fast=False), Poison) for v in small)
    assert rows > valid * 2 // 3


@pytest.mark.parametrize(
    "splice",
    [
        ("output_text", '"a\\u0000b"'),  # the store scrubs NULs: that needs the record path
        ("request", '{"seed": 18446744073709551616}'),  # beyond orjson's 64-bit integers
        ("sent_at", '"2026-11-30T03:00:00"'),  # no zone: pydantic refuses it
    ],
)
def test_rows_decoder_leaves_what_it_is_unsure_of_to_the_record_path(
    splice: tuple[str, str],
) -> None:
    value = _splice(_full_exchange(), *splice)
    assert decode_exchange_row(value) is None
    _same(decode(value, "exchange", rows=True), decode(value, "exchange", fast=False), splice[0])
