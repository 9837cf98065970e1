"""The ingester's fast decoder: the record schemas as msgspec structs, validated in compiled code.

:func:`decode_fast` parses one message value straight into the records of
:mod:`shadow_ab.records` (the same pydantic classes, the same values) about ten times faster
than pydantic does. It is a strict subset of :func:`ingester.decode.decode`: it accepts only
what pydantic accepts, and builds exactly what pydantic builds from it. Anything it is not
certain of (a value pydantic would coerce, such as ``"5"`` for a count or ``5.0`` for a status,
a naive or out-of-range time, a non-finite float, any invalid or unusual message) makes it
return None, and the caller takes pydantic's path, which accepts, coerces or names the
problem exactly as before. :func:`decode_exchange_row` goes one step further for exchanges: from
the struct straight to the store's row values, the very values ``storage.write`` would make of
pydantic's record, with no record object at all (the ingester's ``rows`` decoder).
``tests/ingester/test_ingest_fastdecode.py`` feeds both decoders the
same valid and invalid messages, every field's bad types and bounds, and checks that they agree.

The structs below repeat the fields of :class:`~shadow_ab.records.ExchangeRecord` and
:class:`~shadow_ab.records.HealthSample`; a test fails when the two differ (a field added to
the records must be added here too).
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import orjson
from msgspec import Meta
from pydantic import BaseModel

from shadow_ab.records import (
    INT32_MAX,
    RECORD_TIME_MAX,
    RECORD_TIME_MIN,
    SCHEMA_VERSION,
    Endpoint,
    ExchangeRecord,
    HealthSample,
    Record,
    Role,
    Status,
    TokenLogprob,
)
from storage.write import ExchangeRow, float8_array_wire, json_wire, jsonb_wire

Name = Annotated[str, Meta(min_length=1, max_length=200)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]  # finiteness checked after decoding
Count = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Bytes = Annotated[int, Meta(ge=0)]
HttpStatus = Annotated[int, Meta(ge=100, le=599)]
Version = Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class _Logprob(msgspec.Struct, forbid_unknown_fields=True):
    token: str
    logprob: float  # finiteness checked after decoding
    top: dict[str, float] = {}


# The fields in the pydantic models' order (kw_only lets defaults come first), so that
# msgspec.structs.asdict gives the models' __dict__ as pydantic builds it.
class _Exchange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: Version = SCHEMA_VERSION
    deployment: Name
    kind: Literal["exchange"] = "exchange"
    pair_id: uuid.UUID
    role: Role
    engine: Name
    endpoint: Endpoint
    stream: bool
    model: str | None = None
    sent_at: msgspec.Raw  # read by _time
    status: Status
    http_status: HttpStatus | None = None
    error: str | None = None
    ttft_s: NonNegFloat | None = None
    e2e_s: NonNegFloat | None = None
    tpot_s: NonNegFloat | None = None
    itl_s: list[NonNegFloat] = []
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: str | None = None
    request: dict[str, Any] = {}
    rewrites: list[str] = []
    output_text: str | None = None
    logprobs: list[_Logprob] | None = None
    inflight_incumbent: Count | None = None
    inflight_candidate: Count | None = None
    guard: dict[str, Any] = {}
    synthetic: Literal["probe"] | None = None
    probe_id: Name | None = None


class _Health(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schema_version: Version = SCHEMA_VERSION
    deployment: Name
    kind: Literal["health"] = "health"
    engine: Name
    role: Role
    flavor: Literal["vllm", "trtllm", "unknown"] = "unknown"
    ts: msgspec.Raw  # read by _time
    up: bool
    http_status: HttpStatus | None = None
    latency_s: NonNegFloat | None = None
    error: str | None = None
    version: str | None = None
    process_start_time: float | None = None
    num_running: Count | None = None
    num_waiting: Count | None = None
    kv_cache_usage: Fraction | None = None
    gpu_mem_bytes: Bytes | None = None
    cpu_mem_bytes: Bytes | None = None
    metrics: dict[str, float] = {}


_EXCHANGE = msgspec.json.Decoder(_Exchange)
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "exchange": _EXCHANGE,
    "health": msgspec.json.Decoder(_Health),
}
STRUCTS: dict[type[Any], type[msgspec.Struct]] = {
    ExchangeRecord: _Exchange,
    HealthSample: _Health,
    TokenLogprob: _Logprob,
}
"""Each pydantic record model and the struct that decodes it (the tests compare their fields)."""
_isfinite = math.isfinite
_M = TypeVar("_M", bound=BaseModel)
_decode_time = msgspec.json.Decoder(datetime).decode
_LONG_FRACTION = re.compile(rb"[.,][0-9]{7}").search
_asdict = msgspec.structs.asdict
_set_attr = object.__setattr__
_jsonb = jsonb_wire
_json = json_wire
_floats = float8_array_wire


def _time(raw: msgspec.Raw) -> datetime | None:
    """The time in ``raw`` (its JSON text) in UTC as pydantic's validator makes it, or None
    when pydantic could refuse or read it otherwise: no zone, out of the store's range, or more
    than six digits of a second (msgspec rounds them, pydantic truncates)."""
    if _LONG_FRACTION(raw) is not None:
        return None
    try:
        ts = _decode_time(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if ts.tzinfo is None:
        return None
    ts = ts.astimezone(UTC)
    return ts if RECORD_TIME_MIN <= ts < RECORD_TIME_MAX else None


def _finite(values: list[float]) -> bool:
    """Whether every value (all >= 0: the schema said so) is finite: their sum is then, unless
    it overflows, and a NaN or an infinity makes it NaN or infinite."""
    return _isfinite(sum(values)) or all(map(_isfinite, values))


def _new(cls: type[_M], values: dict[str, Any]) -> _M:
    """An instance of the pydantic model ``cls`` holding ``values`` (already validated, in the
    model's field order), built as ``model_construct`` builds one minus its default handling."""
    obj = cls.__new__(cls)
    _set_attr(obj, "__dict__", values)
    _set_attr(obj, "__pydantic_fields_set__", set(values))
    _set_attr(obj, "__pydantic_extra__", None)
    _set_attr(obj, "__pydantic_private__", None)
    return obj


def _sent_at(s: _Exchange) -> datetime | None:
    """The exchange's ``sent_at`` when its floats are all finite and its time is one pydantic
    reads the same way (see :func:`_time`); None otherwise."""
    for v in (s.ttft_s, s.e2e_s, s.tpot_s):
        if v is not None and not _isfinite(v):
            return None
    if s.itl_s and not _finite(s.itl_s):
        return None
    if s.logprobs is not None and not all(_isfinite(t.logprob) for t in s.logprobs):
        return None
    return _time(s.sent_at)


def _exchange(s: _Exchange) -> ExchangeRecord | None:
    sent_at = _sent_at(s)
    if sent_at is None:
        return None
    values = _asdict(s)
    values["sent_at"] = sent_at
    if s.logprobs is not None:
        values["logprobs"] = [_new(TokenLogprob, _asdict(t)) for t in s.logprobs]
    return _new(ExchangeRecord, values)


def decode_exchange_row(value: bytes) -> ExchangeRow | None:
    """The exchange record ``value`` holds as its store row (:class:`storage.write.ExchangeRow`:
    exactly ``exchange_values(record, WIRE)`` of the record pydantic would build), with no
    record object in between; None when not certain (take :func:`decode_fast` or pydantic's
    path then). Also None for text the store must scrub (an escaped NUL, ``\\u0000``: the
    writer's scrubbing retry needs a record), and for JSON values the JSON encoder refuses
    (integers beyond 64 bits): the record path stores or dead-letters those as before."""
    if b"\\u0000" in value:
        return None
    try:
        s = _EXCHANGE.decode(value)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    sent_at = _sent_at(s)
    if sent_at is None:
        return None
    try:
        logprobs = s.logprobs
        row = (
            s.pair_id,
            s.role.value,
            sent_at,
            s.deployment,
            s.schema_version,
            s.engine,
            s.endpoint.value,
            s.stream,
            s.model,
            s.status.value,
            s.http_status,
            s.error,
            s.ttft_s,
            s.e2e_s,
            s.tpot_s,
            _floats(s.itl_s),
            s.prompt_tokens,
            s.completion_tokens,
            s.finish_reason,
            _json(s.request),
            _jsonb(s.rewrites),
            s.output_text,
            None if logprobs is None else _json([_asdict(t) for t in logprobs]),
            s.inflight_incumbent,
            s.inflight_candidate,
            _jsonb(s.guard),
            s.synthetic,
            s.probe_id,
        )
    except orjson.JSONEncodeError:
        return None
    return ExchangeRow(row, value)


def _health(s: _Health) -> HealthSample | None:
    ts = _time(s.ts)
    if ts is None or (s.latency_s is not None and not _isfinite(s.latency_s)):
        return None
    values = _asdict(s)
    values["ts"] = ts
    return _new(HealthSample, values)


def decode_fast(value: bytes, kind: str) -> Record | None:
    """The record ``value`` holds, decoded by schema in compiled code; None when this decoder is
    not certain pydantic would build exactly this record (take pydantic's path then)."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        return None
    try:
        s = decoder.decode(value)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return _exchange(s) if kind == "exchange" else _health(s)
