"""Decode and validate one Kafka message value into a record, or say why it is poison.

Pure: bytes in, :data:`shadow_ab.records.Record` or :class:`Poison` out. A poison message
will never become valid, so it goes to the dead-letter topic and is never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ingester.fastdecode import decode_exchange_row, decode_fast
from shadow_ab.records import (
    SCHEMA_VERSION,
    ExchangeRecord,
    HealthSample,
    Record,
    RecordError,
    parse_record,
)
from storage.write import ExchangeRow

_MODELS: dict[str, type[ExchangeRecord] | type[HealthSample]] = {
    "exchange": ExchangeRecord,
    "health": HealthSample,
}


class PoisonReason:
    """Short, stable reason codes: the ``reason`` header's first word and the metric label."""

    EMPTY = "empty"
    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    UNKNOWN_KIND = "unknown_kind"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    INVALID_RECORD = "invalid_record"
    WRONG_TOPIC = "wrong_topic"
    STORE_REJECTED = "store_rejected"
    DECODE_FAILED = "decode_failed"
    """Decoding raised something other than a validation error (a bug one message trips)."""


@dataclass(frozen=True)
class Poison:
    """Why a message cannot be stored: a reason code and a sentence for a human."""

    code: str
    detail: str

    @property
    def header(self) -> str:
        return f"{self.code}: {self.detail}"


def decode(
    value: bytes | None,
    expected_kind: str | None = None,
    *,
    fast: bool = True,
    rows: bool = False,
) -> Record | ExchangeRow | Poison:
    """Parse one message value.

    ``expected_kind`` ("exchange" or "health") rejects a valid record sent to the other
    topic, which would otherwise be stored but break the topic's keying promise. ``fast``
    tries the msgspec decoder first (:mod:`ingester.fastdecode`: the same records, the same
    verdicts, several times less CPU); without it, or when it is not certain, pydantic decides.
    ``rows`` (with ``fast``) makes an exchange straight into its store row
    (:class:`storage.write.ExchangeRow`, what the store would make of the record) when the
    msgspec decoder is certain, skipping the record object; anything else as without it.
    """
    if not value:
        return Poison(PoisonReason.EMPTY, "message has no value (null or empty)")
    model = _MODELS.get(expected_kind or "")
    if model is not None:
        if rows and fast and expected_kind == "exchange":
            row = decode_exchange_row(value)
            if row is not None:
                return row
        if fast:
            record = decode_fast(value, expected_kind or "")
            if record is not None:
                return record
        # Fast path: pydantic's own JSON parser validates straight from the bytes (about twice
        # as fast as orjson.loads + model_validate). Anything it refuses takes the slow path
        # below, which says precisely why.
        try:
            return model.model_validate_json(value)
        except ValueError:  # pydantic's ValidationError is a ValueError
            pass
    return _classify(value, expected_kind)


def _classify(value: bytes, expected_kind: str | None) -> Record | Poison:
    try:
        obj: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Poison(PoisonReason.NOT_JSON, f"value is not JSON: {exc}")
    if not isinstance(obj, dict):
        return Poison(PoisonReason.NOT_OBJECT, f"expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind not in ("exchange", "health"):
        return Poison(
            PoisonReason.UNKNOWN_KIND,
            f"unknown record kind {kind!r}: expected 'exchange' or 'health'",
        )
    version = obj.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return Poison(
            PoisonReason.UNSUPPORTED_SCHEMA_VERSION,
            f"schema_version {version} is newer than this build understands"
            f" (1..{SCHEMA_VERSION}); upgrade shadow-ab on the ingester, then replay the DLQ",
        )
    if expected_kind is not None and kind != expected_kind:
        return Poison(
            PoisonReason.WRONG_TOPIC,
            f"a {kind!r} record on the topic for {expected_kind!r} records",
        )
    try:
        return parse_record(obj)
    except RecordError as exc:
        return Poison(PoisonReason.INVALID_RECORD, str(exc))
