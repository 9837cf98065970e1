"""Decoding: records come out as records, everything else as Poison with a reason code."""

from __future__ import annotations

import orjson
import pytest
from factories import numbered_exchange, numbered_health

from ingester.decode import Poison, PoisonReason, decode
from shadow_ab.records import ExchangeRecord, HealthSample


def test_valid_records_decode_to_their_models() -> None:
    rec = numbered_exchange("dep", 1)
    out = decode(rec.to_json(), "exchange")
    assert isinstance(out, ExchangeRecord)
    assert out == rec
    h = numbered_health("dep", 1)
    assert decode(h.to_json(), "health") == h
    assert isinstance(decode(h.to_json()), HealthSample)


@pytest.mark.parametrize(
    ("value", "code", "needle"),
    [
        (None, PoisonReason.EMPTY, "no value"),
        (b"", PoisonReason.EMPTY, "no value"),
        (b"{not json", PoisonReason.NOT_JSON, "not JSON"),
        (b"[1, 2]", PoisonReason.NOT_OBJECT, "got list"),
        (b'{"kind": "banana"}', PoisonReason.UNKNOWN_KIND, "'banana'"),
        (b'{"deployment": "d"}', PoisonReason.UNKNOWN_KIND, "None"),
    ],
)
def test_poison_gets_a_reason(value: bytes | None, code: str, needle: str) -> None:
    out = decode(value, "exchange")
    assert isinstance(out, Poison)
    assert out.code == code
    assert needle in out.detail
    assert out.header.startswith(code + ": ")


def test_newer_schema_version_is_poison_that_says_upgrade() -> None:
    obj = orjson.loads(numbered_exchange("dep", 1).to_json())
    obj["schema_version"] = 99
    out = decode(orjson.dumps(obj), "exchange")
    assert isinstance(out, Poison)
    assert out.code == PoisonReason.UNSUPPORTED_SCHEMA_VERSION
    assert "upgrade shadow-ab" in out.detail


def test_wrong_shape_is_invalid_record_naming_the_field() -> None:
    obj = orjson.loads(numbered_exchange("dep", 1).to_json())
    del obj["pair_id"]
    obj["ttft_s"] = -1
    out = decode(orjson.dumps(obj), "exchange")
    assert isinstance(out, Poison)
    assert out.code == PoisonReason.INVALID_RECORD
    assert "pair_id" in out.detail
    assert "ttft_s" in out.detail


def test_record_on_the_other_kinds_topic_is_poison() -> None:
    out = decode(numbered_health("dep", 1).to_json(), "exchange")
    assert isinstance(out, Poison)
    assert out.code == PoisonReason.WRONG_TOPIC
