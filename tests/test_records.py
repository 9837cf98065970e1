"""The record contract: round trips, and malformed payloads rejected with a reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from factories import exchange_document, health

from shadow_ab.records import (
    SCHEMA_VERSION,
    ExchangeRecord,
    RecordError,
    Role,
    Status,
    parse_exchange,
    parse_health,
    parse_record,
)


def test_exchange_round_trips_through_json() -> None:
    document = exchange_document(
        role="candidate", engine="trtllm@candidate", sent_at="2026-11-30T03:00:00.123456Z"
    )
    rec = parse_exchange(orjson.dumps(document))
    assert rec.role is Role.CANDIDATE and rec.status is Status.OK
    assert rec.sent_at == datetime(2026, 11, 30, 3, 0, 0, 123456, tzinfo=UTC)
    assert rec.greedy
    again = parse_record(rec.to_json())
    assert again == rec


def test_sent_at_with_offset_is_normalised_to_utc() -> None:
    rec = parse_exchange(exchange_document(sent_at="2026-11-30T04:00:00+01:00"))
    assert rec.sent_at.utcoffset() == timedelta(0)
    assert rec.sent_at.hour == 3


def test_health_sample_round_trips() -> None:
    sample = health(
        flavor="vllm",
        ts=datetime(2026, 11, 30, tzinfo=timezone(timedelta(hours=2))),
        gpu_mem_bytes=10,
        metrics={"vllm:num_requests_running": 3.0},
    )
    assert parse_health(sample.to_json()) == sample


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (orjson.dumps({"kind": "metrics"}), "unknown record kind"),
        (orjson.dumps(exchange_document(schema_version=SCHEMA_VERSION + 1)), "schema_version"),
        (orjson.dumps(exchange_document(role="shadow")), "role"),
        (orjson.dumps(exchange_document(ttft_s=-1)), "ttft_s"),
        (exchange_document(itl_s=[0.01, float("inf")]), "itl_s"),
        (exchange_document(e2e_s=float("nan")), "e2e_s"),
        (orjson.dumps(exchange_document(sent_at="2026-11-30T03:00:00")), "timezone"),
        (orjson.dumps(exchange_document(pair_id="nope")), "pair_id"),
        (orjson.dumps(exchange_document(surprise=1)), "surprise"),
        (
            orjson.dumps({k: v for k, v in exchange_document().items() if k != "deployment"}),
            "deployment",
        ),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(
    payload: bytes | dict[str, Any], reason: str
) -> None:
    with pytest.raises(RecordError, match=reason):
        parse_record(payload)


def test_kind_mismatch_is_an_error() -> None:
    with pytest.raises(RecordError, match="expected a health record"):
        parse_health(exchange_document())
    rec = ExchangeRecord.model_validate(exchange_document())
    with pytest.raises(RecordError, match="expected an exchange record"):
        parse_exchange(
            health(
                deployment=rec.deployment,
                engine=rec.engine,
                role=rec.role,
                ts=rec.sent_at,
                up=False,
            ).to_json()
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [("completion_tokens", 2**31), ("inflight_candidate", 2**40), ("http_status", 42)],
)
def test_counts_beyond_what_the_store_holds_are_malformed(field: str, value: int) -> None:
    with pytest.raises(RecordError, match=field):
        parse_record(exchange_document(**{field: value}))


@pytest.mark.parametrize(
    "when",
    [
        "9999-12-31T00:00:00Z",
        "9999-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "0001-01-01T00:00:00Z",
    ],
)
def test_times_the_store_cannot_hold_are_refused_at_parse_time(when: str) -> None:
    """9999-12-31 once crash-looped the ingester (no day after it for a partition)."""
    with pytest.raises(RecordError, match=r"sent_at .* outside the range the store keeps"):
        parse_record(orjson.dumps(exchange_document(sent_at=when)))
    doc = orjson.loads(health().to_json())
    doc["ts"] = when
    with pytest.raises(RecordError, match=r"ts .* outside the range the store keeps"):
        parse_record(doc)


def test_the_last_storable_instant_is_accepted() -> None:
    rec = parse_record(exchange_document(sent_at="9998-12-31T23:59:59.999999Z"))
    assert isinstance(rec, ExchangeRecord) and rec.sent_at.year == 9998
